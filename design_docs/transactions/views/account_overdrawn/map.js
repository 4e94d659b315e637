function (doc) {
  // Accounts below their minimum balance: [currency, account_id] -> [balance, min_balance].
  // Never one on a single node; on a cluster, two debits checked against one balance on two
  // copies can both pass, and their merge overdraws (docs/CLUSTER.md). `status` counts them.
  if (typeof doc !== 'object' || doc === null || doc.type !== 'account') { return; }
  if (typeof doc.balance !== 'number' || typeof doc.min_balance !== 'number') { return; }
  if (doc.balance < doc.min_balance) {
    emit([doc.currency, doc.account_id], [doc.balance, doc.min_balance]);
  }
}
