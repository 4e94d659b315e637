function (doc) {
  // Pending markers of accounts, oldest first: [at, txn] -> delta (row id = the account).
  // The sweeper reads the markers older than its threshold to find orphans: a marker whose
  // transfer already finished. A marker without `at` sorts first (treated as old).
  if (typeof doc !== 'object' || doc === null) { return; }
  if (doc.type !== 'account' || !(doc.pending instanceof Array)) { return; }
  for (var i = 0; i < doc.pending.length; i++) {
    var m = doc.pending[i];
    if (typeof m !== 'object' || m === null || typeof m.txn !== 'string') { continue; }
    var at = (typeof m.at === 'number' && isFinite(m.at)) ? m.at : 0;
    var delta = (typeof m.delta === 'number' && isFinite(m.delta)) ? m.delta : 0;
    emit([at, m.txn], delta);
  }
}
