function (doc) {
  // An account's history: [account, decided time, txn_id] -> the transfer's delta on it, for
  // committed and done transfers only (the rule of transactions/by_account and of verify's
  // exactly-once check, so a history sums to what verify counts). `decided_at` is when the
  // outcome was written; a document from before it existed takes `last_modified`, and one
  // with neither a number sorts first (0) rather than go missing from the sums.
  if (typeof doc !== 'object' || doc === null) { return; }
  if (doc.type !== 'transaction') { return; }
  if (doc.state !== 'committed' && doc.state !== 'done') { return; }
  if (typeof doc.source !== 'string' || typeof doc.destination !== 'string') { return; }
  if (typeof doc.value !== 'number' || !isFinite(doc.value)) { return; }
  var at = doc.decided_at;
  if (typeof at !== 'number' || !isFinite(at)) { at = doc.last_modified; }
  if (typeof at !== 'number' || !isFinite(at)) { at = 0; }
  var id = typeof doc.txn_id === 'string' ? doc.txn_id : String(doc._id);
  emit([doc.source, at, id], -doc.value);
  emit([doc.destination, at, id], doc.value);
}
