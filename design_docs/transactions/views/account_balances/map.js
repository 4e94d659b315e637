function (doc) {
  // Every account: [currency, account_id] -> [opening, balance]. Paged with include_docs by the
  // auditor; group_level=1 gives each currency's opening and current totals (conservation).
  // A malformed account still gets a row (value [0, 0]) so the auditor sees and reports it.
  if (typeof doc !== 'object' || doc === null || doc.type !== 'account') { return; }
  var currency = typeof doc.currency === 'string' ? doc.currency : '?';
  var id = typeof doc.account_id === 'string' ? doc.account_id : String(doc._id);
  var ok = typeof doc.opening === 'number' && isFinite(doc.opening) &&
    typeof doc.balance === 'number' && isFinite(doc.balance);
  emit([currency, id], ok ? [doc.opening, doc.balance] : [0, 0]);
}
