function (doc) {
  // Money in state 'pending', per currency: currency -> value (group=true gives each total).
  if (typeof doc !== 'object' || doc === null) { return; }
  if (doc.type !== 'transaction' || doc.state !== 'pending') { return; }
  // The same transfers as transactions/pending, keyed by currency instead of accounts.
  if (typeof doc.source !== 'string' || typeof doc.destination !== 'string') { return; }
  if (typeof doc.currency !== 'string') { return; }
  if (typeof doc.value !== 'number' || !isFinite(doc.value)) { return; }
  emit(doc.currency, doc.value);
}
