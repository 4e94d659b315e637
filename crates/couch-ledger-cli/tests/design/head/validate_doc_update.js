function (newDoc, oldDoc, userCtx, secObj) {
  // Server-side guard of couch-ledger (docs/DOCUMENTS.md). Runs for every writer,
  // admins included. Plain ES5: no let/const/arrow functions.
  var MAX = 9007199254740991;
  var IMMUTABLE = {
    purchase: true, payment: true, refund: true,
    adjustment: true, shipment: true, delivery: true
  };
  var OURS = {
    purchase: true, payment: true, refund: true, adjustment: true,
    shipment: true, delivery: true, account: true, transaction: true
  };
  // Id prefix -> the only type a document under that prefix may have.
  var PREFIX = [
    ['purchase:', 'purchase'], ['payment:', 'payment'], ['refund:', 'refund'],
    ['adjustment:', 'adjustment'], ['shipment:', 'shipment'], ['delivery:', 'delivery'],
    ['account:', 'account'], ['txn:', 'transaction']
  ];
  var TRANSITIONS = {
    initial: { pending: true, cancelled: true },
    pending: { committed: true, canceling: true },
    committed: { done: true },
    canceling: { cancelled: true },
    done: {},
    cancelled: {}
  };

  var id = newDoc._id;
  if (typeof id === 'string' && id.indexOf('_design/') === 0) { return; }

  var oldLive = !!oldDoc && !oldDoc._deleted;
  var oldType = oldLive ? oldDoc.type : undefined;

  function deny(what, msg) {
    throw({ forbidden: what + ': ' + msg });
  }
  function isInt(x) {
    return typeof x === 'number' && Math.floor(x) === x && x <= MAX && x >= -MAX;
  }
  function isStr(x) { return typeof x === 'string' && x.length > 0; }
  function isNullableStr(x) { return x === undefined || x === null || typeof x === 'string'; }
  function isObj(x) { return typeof x === 'object' && x !== null && !(x instanceof Array); }
  function norm(x) { return x === undefined ? null : x; }
  function same(a, b) { return JSON.stringify(norm(a)) === JSON.stringify(norm(b)); }

  function needStr(t, doc, f) {
    if (!isStr(doc[f])) { deny(t, "field '" + f + "' is required and must be a non-empty string"); }
  }
  function needNullableStr(t, doc, f) {
    if (!isNullableStr(doc[f])) { deny(t, "field '" + f + "' must be a string or null"); }
  }
  function needInt(t, doc, f, label) {
    if (!isInt(doc[f])) {
      deny(t, "field '" + (label || f) + "' must be an integer number of minor units with |x| <= 9007199254740991");
    }
  }
  function needCurrency(t, doc) {
    if (typeof doc.currency !== 'string' || !/^[A-Z]{3}$/.test(doc.currency)) {
      deny(t, "field 'currency' must be an ISO-4217 code (three upper-case letters)");
    }
  }
  function needId(t, expected) {
    if (id !== expected) {
      deny(t, "field '_id' must be '" + expected + "', got '" + id + "'");
    }
  }

  // ---- deletion -------------------------------------------------------------
  if (newDoc._deleted) {
    if (oldLive && (IMMUTABLE[oldType] === true || oldType === 'account' || oldType === 'transaction')) {
      deny(oldType, "documents of type '" + oldType + "' may never be deleted (field '_deleted')");
    }
    return;
  }

  var type = newDoc.type;

  // ---- the type of one of our documents never changes ------------------------
  if (oldLive && OURS[oldType] === true && type !== oldType) {
    deny(oldType, "field 'type' may not change (was '" + oldType + "')");
  }

  // ---- our id prefixes are reserved for our types ---------------------------
  if (typeof id === 'string') {
    for (var p = 0; p < PREFIX.length; p++) {
      if (id.indexOf(PREFIX[p][0]) === 0 && type !== PREFIX[p][1]) {
        deny(String(type), "field 'type' must be '" + PREFIX[p][1] + "' for an id starting with '" + PREFIX[p][0] + "'");
      }
    }
  }

  if (typeof type !== 'string' || OURS[type] !== true) {
    return; // another application's document
  }

  // ---- immutable ledger documents -------------------------------------------
  if (IMMUTABLE[type] === true) {
    if (oldLive) {
      deny(type, "documents are write-once; '" + id + "' already exists and may not be updated");
    }
    needStr(type, newDoc, 'order_id');
    var oid = newDoc.order_id;

    if (type === 'purchase') {
      needId(type, 'purchase:' + oid);
    } else if (type === 'payment') {
      needStr(type, newDoc, 'payment_reference');
      needId(type, 'payment:' + oid + ':' + newDoc.payment_reference);
    } else if (type === 'refund') {
      needStr(type, newDoc, 'refund_reference');
      needId(type, 'refund:' + oid + ':' + newDoc.refund_reference);
    } else {
      needStr(type, newDoc, 'reference');
      needId(type, type + ':' + oid + ':' + newDoc.reference);
    }

    if (type === 'shipment') {
      needNullableStr(type, newDoc, 'carrier');
      return;
    }
    if (type === 'delivery') {
      return;
    }

    // money documents
    needStr(type, newDoc, 'account_id');
    needCurrency(type, newDoc);

    if (type === 'purchase') {
      var basket = newDoc.basket;
      if (!(basket instanceof Array)) { deny(type, "field 'basket' must be an array"); }
      for (var i = 0; i < basket.length; i++) {
        var item = basket[i];
        var at = 'basket[' + i + ']';
        if (!isObj(item)) { deny(type, "field '" + at + "' must be an object"); }
        if (!isStr(item.product_id)) { deny(type, "field '" + at + ".product_id' must be a non-empty string"); }
        if (!isNullableStr(item.title)) { deny(type, "field '" + at + ".title' must be a string or null"); }
        if (!isNullableStr(item.category)) { deny(type, "field '" + at + ".category' must be a string or null"); }
        if (!isInt(item.price) || item.price < 0) {
          deny(type, "field '" + at + ".price' must be an integer >= 0 and <= 9007199254740991");
        }
        if (!isInt(item.tax) || item.tax < 0) {
          deny(type, "field '" + at + ".tax' must be an integer >= 0 and <= 9007199254740991");
        }
        if (!isInt(item.quantity) || item.quantity < 1) {
          deny(type, "field '" + at + ".quantity' must be a positive integer");
        }
      }
      var delivery = newDoc.delivery;
      if (!isObj(delivery)) { deny(type, "field 'delivery' must be an object {option, price, address}"); }
      if (!isNullableStr(delivery.option)) { deny(type, "field 'delivery.option' must be a string or null"); }
      needInt(type, delivery, 'price', 'delivery.price');
      if (delivery.address === undefined) { deny(type, "field 'delivery.address' is required"); }
      needInt(type, newDoc, 'pretax');
      needInt(type, newDoc, 'tax');
      needInt(type, newDoc, 'total');
      if (newDoc.total !== newDoc.pretax + newDoc.tax + delivery.price) {
        deny(type, "field 'total' must equal pretax + tax + delivery.price (" +
          newDoc.pretax + ' + ' + newDoc.tax + ' + ' + delivery.price + ' = ' +
          (newDoc.pretax + newDoc.tax + delivery.price) + '), got ' + newDoc.total);
      }
      return;
    }

    needInt(type, newDoc, 'value');
    if (type === 'adjustment') {
      if (newDoc.value === 0) { deny(type, "field 'value' must not be 0"); }
      needNullableStr(type, newDoc, 'reason');
    } else {
      if (newDoc.value <= 0) { deny(type, "field 'value' must be > 0"); }
      if (type === 'payment') {
        needNullableStr(type, newDoc, 'method');
      } else {
        needNullableStr(type, newDoc, 'reason');
      }
    }
    return;
  }

  // ---- accounts -------------------------------------------------------------
  if (type === 'account') {
    needStr(type, newDoc, 'account_id');
    needId(type, 'account:' + newDoc.account_id);
    needCurrency(type, newDoc);
    needInt(type, newDoc, 'opening');
    needInt(type, newDoc, 'balance');
    if (newDoc.min_balance !== null && newDoc.min_balance !== undefined) {
      // Types only: the protocol checks funds, and a rollback must never be blocked.
      needInt(type, newDoc, 'min_balance');
    }
    if (!(newDoc.pending instanceof Array)) { deny(type, "field 'pending' must be an array"); }
    for (var j = 0; j < newDoc.pending.length; j++) {
      var pe = newDoc.pending[j];
      if (!isObj(pe)) { deny(type, "field 'pending[" + j + "]' must be an object {txn, delta}"); }
      if (!isStr(pe.txn)) { deny(type, "field 'pending[" + j + "].txn' must be a non-empty string"); }
      if (!isInt(pe.delta) || pe.delta === 0) {
        deny(type, "field 'pending[" + j + "].delta' must be a non-zero integer with |x| <= 9007199254740991");
      }
    }
    if (!(newDoc.settled instanceof Array)) { deny(type, "field 'settled' must be an array"); }
    for (var k = 0; k < newDoc.settled.length; k++) {
      var se = newDoc.settled[k];
      if (!isObj(se)) { deny(type, "field 'settled[" + k + "]' must be an object {txn, at}"); }
      if (!isStr(se.txn)) { deny(type, "field 'settled[" + k + "].txn' must be a non-empty string"); }
      if (typeof se.at !== 'number' || !isFinite(se.at)) {
        deny(type, "field 'settled[" + k + "].at' must be a number (ms since epoch)");
      }
    }
    if (oldLive) {
      var fixedA = ['account_id', 'currency', 'opening'];
      for (var a = 0; a < fixedA.length; a++) {
        if (!same(newDoc[fixedA[a]], oldDoc[fixedA[a]])) {
          deny(type, "field '" + fixedA[a] + "' may not change (was " +
            JSON.stringify(norm(oldDoc[fixedA[a]])) + ', got ' + JSON.stringify(norm(newDoc[fixedA[a]])) + ')');
        }
      }
    }
    return;
  }

  // ---- transfers ------------------------------------------------------------
  if (type === 'transaction') {
    needStr(type, newDoc, 'txn_id');
    needId(type, 'txn:' + newDoc.txn_id);
    needStr(type, newDoc, 'source');
    needStr(type, newDoc, 'destination');
    if (newDoc.source === newDoc.destination) {
      deny(type, "fields 'source' and 'destination' must differ");
    }
    needInt(type, newDoc, 'value');
    if (newDoc.value <= 0) { deny(type, "field 'value' must be > 0"); }
    needCurrency(type, newDoc);
    var state = newDoc.state;
    if (typeof state !== 'string' || !TRANSITIONS.hasOwnProperty(state)) {
      deny(type, "field 'state' must be one of initial, pending, committed, done, canceling, cancelled");
    }
    needNullableStr(type, newDoc, 'reason');
    needNullableStr(type, newDoc, 'reverses');
    if (typeof newDoc.last_modified !== 'number' || !isFinite(newDoc.last_modified)) {
      deny(type, "field 'last_modified' must be a number (ms since epoch)");
    }

    if (!oldLive) {
      if (state !== 'initial' && state !== 'pending') {
        deny(type, "field 'state' of a new transfer must be 'initial' or 'pending', got '" + state + "'");
      }
      return;
    }

    var fixedT = ['txn_id', 'source', 'destination', 'value', 'currency', 'reverses', 'created_at'];
    for (var t = 0; t < fixedT.length; t++) {
      if (!same(newDoc[fixedT[t]], oldDoc[fixedT[t]])) {
        deny(type, "field '" + fixedT[t] + "' is a term of the transfer and may not change (was " +
          JSON.stringify(norm(oldDoc[fixedT[t]])) + ', got ' + JSON.stringify(norm(newDoc[fixedT[t]])) + ')');
      }
    }
    var from = oldDoc.state;
    if (state !== from) {
      var allowed = (typeof from === 'string' && TRANSITIONS.hasOwnProperty(from)) ? TRANSITIONS[from] : {};
      if (allowed[state] !== true) {
        deny(type, "field 'state' may not change from '" + from + "' to '" + state + "'");
      }
    }
    return;
  }
}
