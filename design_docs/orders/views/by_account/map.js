function (doc) {
  // A customer's statement: [account_id, order_id] -> signed amount (as orders/ledger).
  if (typeof doc !== 'object' || doc === null) { return; }
  if (typeof doc.order_id !== 'string' || typeof doc.account_id !== 'string') { return; }
  var amount;
  if (doc.type === 'purchase') {
    amount = doc.total;
  } else if (doc.type === 'adjustment' || doc.type === 'refund') {
    amount = doc.value;
  } else if (doc.type === 'payment') {
    amount = (typeof doc.value === 'number') ? -doc.value : undefined;
  } else {
    return;
  }
  if (typeof amount !== 'number' || !isFinite(amount)) { return; }
  emit([doc.account_id, doc.order_id], amount);
}
