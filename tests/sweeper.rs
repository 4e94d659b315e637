// (filled in by the sweeper work)
