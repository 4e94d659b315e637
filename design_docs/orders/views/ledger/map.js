function (doc) {
  // Order balance: purchase +total, adjustment +value, payment -value, refund +value.
  if (typeof doc !== 'object' || doc === null) { return; }
  if (typeof doc.order_id !== 'string') { return; }
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
  emit(doc.order_id, amount);
}
