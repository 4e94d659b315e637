function (doc) {
  // The sweeper's queue, oldest first: [state, last_modified] -> 1.
  if (typeof doc !== 'object' || doc === null) { return; }
  if (doc.type !== 'transaction' || typeof doc.state !== 'string') { return; }
  if (typeof doc.last_modified !== 'number' || !isFinite(doc.last_modified)) { return; }
  emit([doc.state, doc.last_modified], 1);
}
