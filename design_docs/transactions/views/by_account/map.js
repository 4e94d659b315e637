function (doc) {
  // Reconciliation: account -> +/- value for committed and done transfers.
  if (typeof doc !== 'object' || doc === null) { return; }
  if (doc.type !== 'transaction') { return; }
  if (doc.state !== 'committed' && doc.state !== 'done') { return; }
  if (typeof doc.source !== 'string' || typeof doc.destination !== 'string') { return; }
  if (typeof doc.value !== 'number' || !isFinite(doc.value)) { return; }
  emit(doc.source, -doc.value);
  emit(doc.destination, doc.value);
}
