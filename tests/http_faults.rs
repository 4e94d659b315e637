// (filled in by the http_faults work)
