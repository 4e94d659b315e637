// (filled in by the orders work)
