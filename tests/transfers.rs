// (filled in by the transfers work)
