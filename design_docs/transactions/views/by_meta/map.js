function (doc) {
  // Transfers by their metadata: [key, value, created_at, txn_id] -> null, one row per key of
  // the transfer's `meta` whose value is a string. Read newest first, paged on the last key.
  if (typeof doc !== 'object' || doc === null) { return; }
  if (doc.type !== 'transaction') { return; }
  var meta = doc.meta;
  if (typeof meta !== 'object' || meta === null || Array.isArray(meta)) { return; }
  var at = typeof doc.created_at === 'number' && isFinite(doc.created_at) ? doc.created_at : 0;
  var id = typeof doc.txn_id === 'string' ? doc.txn_id : String(doc._id);
  for (var key in meta) {
    if (Object.prototype.hasOwnProperty.call(meta, key) && typeof meta[key] === 'string') {
      emit([key, meta[key], at, id], null);
    }
  }
}
