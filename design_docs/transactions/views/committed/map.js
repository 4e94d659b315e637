function (doc) {
  // Money in state 'committed': [source, destination] -> value.
  if (typeof doc !== 'object' || doc === null) { return; }
  if (doc.type !== 'transaction' || doc.state !== 'committed') { return; }
  if (typeof doc.source !== 'string' || typeof doc.destination !== 'string') { return; }
  if (typeof doc.value !== 'number' || !isFinite(doc.value)) { return; }
  emit([doc.source, doc.destination], doc.value);
}
