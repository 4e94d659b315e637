function (doc) {
  // Ledger documents holding a conflict (docs/CLUSTER.md): [type, _id] -> how many losing
  // leaves. CouchDB gives a map function `_conflicts` when the document has any. The sweeper
  // resolves accounts and transfers; `status` counts them all.
  if (typeof doc !== 'object' || doc === null) { return; }
  if (!Array.isArray(doc._conflicts) || doc._conflicts.length === 0) { return; }
  var OURS = {
    purchase: true, payment: true, refund: true, adjustment: true,
    shipment: true, delivery: true, account: true, transaction: true
  };
  if (typeof doc.type !== 'string' || OURS[doc.type] !== true) { return; }
  emit([doc.type, doc._id], doc._conflicts.length);
}
