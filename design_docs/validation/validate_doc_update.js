function (newDoc, oldDoc, userCtx, secObj) {
  // Server-side guard of couch-ledger (docs/DOCUMENTS.md). Runs for every writer,
  // admins included. Plain ES5: no let/const/arrow functions.
  // CouchDB runs this function in a sandbox with its own JS realm and parses the documents
  // outside it: `x instanceof Array` is false for every array of a document, and prototypes and
  // constructors are not the sandbox's. Test shapes with typeof and Array.isArray only.
  var MAX = 9007199254740991;
  // Write-once: the order ledger's entries, and the opening record of each account.
  var IMMUTABLE = {
    purchase: true, payment: true, refund: true,
    adjustment: true, shipment: true, delivery: true, opening: true
  };
  var OURS = {
    purchase: true, payment: true, refund: true, adjustment: true,
    shipment: true, delivery: true, opening: true, account: true, transaction: true
  };
  // Id prefix -> the only type a document under that prefix may have.
  var PREFIX = [
    ['purchase:', 'purchase'], ['payment:', 'payment'], ['refund:', 'refund'],
    ['adjustment:', 'adjustment'], ['shipment:', 'shipment'], ['delivery:', 'delivery'],
    ['opening:', 'opening'], ['account:', 'account'], ['txn:', 'transaction']
  ];
  // One step of a transfer's state graph (docs/DOCUMENTS.md); `initial -> done` is the one-write
  // path's decision (docs/ONE_WRITE.md).
  var TRANSITIONS = {
    initial: { pending: true, cancelled: true, done: true },
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

  // A write with new_edits=false (replication, or history forged by hand) arrives with
  // newDoc._rev set to the NEW revision, and oldDoc its nearest stored ancestor, or null for a
  // new root such as '1-ffff' of an existing document. An interactive create has no _rev; an
  // interactive update names its parent: newDoc._rev === oldDoc._rev. A _rev older than the
  // stored one is a stale interactive update (CouchDB answers 409 before validating it;
  // pouchdb-server validates it against the newer document first): not a replicated write.
  var replicated = typeof newDoc._rev === 'string' &&
    (!oldDoc || (newDoc._rev !== oldDoc._rev && revPos(newDoc._rev) >= revPos(oldDoc._rev)));
  // An interactive creation: the document starts its history here.
  var creating = !oldLive && !replicated;
  var roles = (userCtx && Array.isArray(userCtx.roles)) ? userCtx.roles : [];
  var isAdmin = roles.indexOf('_admin') !== -1;

  function deny(what, msg) {
    throw({ forbidden: what + ': ' + msg });
  }
  function isInt(x) {
    return typeof x === 'number' && Math.floor(x) === x && x <= MAX && x >= -MAX;
  }
  function isStr(x) { return typeof x === 'string' && x.length > 0; }
  function isNullableStr(x) { return x === undefined || x === null || typeof x === 'string'; }
  function isObj(x) { return typeof x === 'object' && x !== null && !Array.isArray(x); }
  function norm(x) { return x === undefined ? null : x; }
  // JSON text with every object's keys in order: a writer that reorders keys (a JSON library
  // keeping them sorted) changes nothing.
  function canon(x) {
    if (Array.isArray(x)) {
      var items = [];
      for (var i = 0; i < x.length; i++) { items.push(canon(x[i])); }
      return '[' + items.join(',') + ']';
    }
    if (typeof x === 'object' && x !== null) {
      var keys = [];
      for (var k in x) { if (x.hasOwnProperty(k)) { keys.push(k); } }
      keys.sort();
      var parts = [];
      for (var j = 0; j < keys.length; j++) { parts.push(JSON.stringify(keys[j]) + ':' + canon(x[keys[j]])); }
      return '{' + parts.join(',') + '}';
    }
    return JSON.stringify(x);
  }
  function same(a, b) { return canon(norm(a)) === canon(norm(b)); }

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
  function sameMeta(a, b) {
    var x = isObj(a) ? a : {};
    var y = isObj(b) ? b : {};
    var k;
    for (k in x) { if (x.hasOwnProperty(k) && x[k] !== y[k]) { return false; } }
    for (k in y) { if (y.hasOwnProperty(k) && x[k] !== y[k]) { return false; } }
    return true;
  }
  function revPos(rev) {
    var n = parseInt(String(rev), 10);
    return isFinite(n) ? n : 0;
  }
  function prefixType(x) {
    if (typeof x !== 'string') { return undefined; }
    for (var i = 0; i < PREFIX.length; i++) {
      if (x.indexOf(PREFIX[i][0]) === 0) { return PREFIX[i][1]; }
    }
    return undefined;
  }
  // Whether `to` is reached from `from` along the state graph (one step or more).
  function reachable(from, to) {
    var seen = {};
    var todo = [from];
    while (todo.length > 0) {
      var s = todo.pop();
      if (typeof s !== 'string' || !TRANSITIONS.hasOwnProperty(s) || seen[s] === true) { continue; }
      seen[s] = true;
      for (var next in TRANSITIONS[s]) {
        if (TRANSITIONS[s].hasOwnProperty(next)) {
          if (next === to) { return true; }
          todo.push(next);
        }
      }
    }
    return false;
  }
  function needId(t, expected) {
    if (id !== expected) {
      deny(t, "field '_id' must be '" + expected + "', got '" + id + "'");
    }
  }

  // ---- replicated or forged history of ledger documents: server admins only ----
  // CouchDB's read repair writes as an admin and its internal replication between copies of a
  // cluster skips validation; a member replicating (or forging) revisions of the ledger could
  // add a conflicting branch that wins, or a history that never passed these rules.
  if (replicated && !isAdmin) {
    var ledgerType = (typeof newDoc.type === 'string' && OURS[newDoc.type] === true) ? newDoc.type :
      (oldLive && OURS[oldType] === true) ? oldType : prefixType(id);
    if (ledgerType !== undefined) {
      deny(ledgerType, "a write with new_edits=false (revision '" + newDoc._rev +
        "': replicated or forged history) is refused; only a server admin ('_admin' in userCtx.roles) may write the history of ledger documents");
    }
  }

  // ---- deletion -------------------------------------------------------------
  // A conflict's losing leaf of an account or a transfer is deleted once its content is merged
  // into the winner (docs/CLUSTER.md): a deletion naming the revision it was merged into
  // (`merged_into`). This function cannot tell a losing leaf from the only one, so only a
  // server admin may write one; a plain deletion is refused to everyone, write-once documents
  // are never deleted.
  if (newDoc._deleted) {
    var mutable = oldType === 'account' || oldType === 'transaction';
    var merge = mutable && isAdmin && typeof newDoc.merged_into === 'string';
    if (oldLive && (IMMUTABLE[oldType] === true || (mutable && !merge))) {
      deny(oldType, "documents of type '" + oldType + "' may never be deleted (field '_deleted')" +
        (mutable ? "; only a server admin may delete the losing leaf of a conflict, naming the revision it was merged into ('merged_into')" : ""));
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

  // ---- metadata: what a caller attached (docs/DOCUMENTS.md) -------------------
  // At most 16 keys of 1 to 40 characters of A-Z a-z 0-9 _ -, each to a string of 1 to 256
  // characters (code points) without a control character.
  if (newDoc.meta !== undefined) {
    if (!isObj(newDoc.meta)) { deny(type, "field 'meta' must be an object of strings"); }
    var metaKeys = 0;
    for (var mk in newDoc.meta) {
      if (!newDoc.meta.hasOwnProperty(mk)) { continue; }
      metaKeys++;
      if (!/^[A-Za-z0-9_-]{1,40}$/.test(mk)) {
        deny(type, "field 'meta' has a key '" + mk + "' that is not 1 to 40 characters of A-Z a-z 0-9 _ -");
      }
      var mv = newDoc.meta[mk];
      var points = typeof mv === 'string' ? mv.replace(/[\uD800-\uDBFF][\uDC00-\uDFFF]/g, '_').length : 0;
      if (points < 1 || points > 256 || /[\x00-\x1f\x7f-\x9f]/.test(mv)) {
        deny(type, "field 'meta." + mk + "' must be a string of 1 to 256 characters without a control character");
      }
    }
    if (metaKeys > 16) { deny(type, "field 'meta' holds " + metaKeys + " keys; at most 16"); }
  }
  // Written once: an account or a transfer keeps the metadata it was created with (in any key
  // order).
  if (oldLive && (type === 'account' || type === 'transaction') && !sameMeta(newDoc.meta, oldDoc.meta)) {
    deny(type, "field 'meta' is written once, with the document");
  }

  // ---- immutable ledger documents -------------------------------------------
  if (IMMUTABLE[type] === true) {
    if (oldLive) {
      deny(type, "documents are write-once; '" + id + "' already exists and may not be updated");
    }
    if (type === 'opening') {
      // The terms an account was created with, written before the account: what verify takes
      // its opening, currency and minimum from, wherever the account lives (docs/LAYOUT.md).
      needStr(type, newDoc, 'account_id');
      needId(type, 'opening:' + newDoc.account_id);
      needCurrency(type, newDoc);
      needInt(type, newDoc, 'opening');
      if (newDoc.min_balance === undefined) {
        deny(type, "field 'min_balance' is required (null for an unlimited account)");
      }
      if (newDoc.min_balance !== null) { needInt(type, newDoc, 'min_balance'); }
      return;
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
      if (!Array.isArray(basket)) { deny(type, "field 'basket' must be an array"); }
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
    if (!Array.isArray(newDoc.pending)) { deny(type, "field 'pending' must be an array"); }
    for (var j = 0; j < newDoc.pending.length; j++) {
      var pe = newDoc.pending[j];
      if (!isObj(pe)) { deny(type, "field 'pending[" + j + "]' must be an object {txn, delta}"); }
      if (!isStr(pe.txn)) { deny(type, "field 'pending[" + j + "].txn' must be a non-empty string"); }
      if (!isInt(pe.delta) || pe.delta === 0) {
        deny(type, "field 'pending[" + j + "].delta' must be a non-zero integer with |x| <= 9007199254740991");
      }
    }
    if (!Array.isArray(newDoc.settled)) { deny(type, "field 'settled' must be an array"); }
    // An entry per transfer {txn, at, undone: bool} (earlier versions), or a group of one date
    // {at, txns: [ids], undone: [ids]} (docs/DOCUMENTS.md).
    for (var k = 0; k < newDoc.settled.length; k++) {
      var se = newDoc.settled[k];
      var sp = "field 'settled[" + k + "]";
      if (!isObj(se)) { deny(type, sp + "' must be an object {at, txns, undone} or {txn, at}"); }
      if (typeof se.at !== 'number' || !isFinite(se.at)) {
        deny(type, sp + ".at' must be a number (ms since epoch)");
      }
      if (se.txn !== undefined) {
        if (!isStr(se.txn)) { deny(type, sp + ".txn' must be a non-empty string"); }
        if (se.txns !== undefined) { deny(type, sp + "' has both 'txn' and 'txns'"); }
        if (se.undone !== undefined && typeof se.undone !== 'boolean') {
          deny(type, sp + ".undone' must be true or false in an entry with 'txn'");
        }
      } else {
        var lists = ['txns', 'undone'];
        for (var l = 0; l < lists.length; l++) {
          var ids = se[lists[l]];
          if (ids === undefined) { continue; }
          if (!Array.isArray(ids)) { deny(type, sp + '.' + lists[l] + "' must be an array of transfer ids"); }
          for (var m = 0; m < ids.length; m++) {
            if (!isStr(ids[m])) { deny(type, sp + '.' + lists[l] + '[' + m + "]' must be a non-empty string"); }
          }
        }
        // Of an undone one-write marker, the attempts it carried: {txn: [attempt, ...]}.
        var of = se.undone_attempts;
        if (of !== undefined) {
          if (!isObj(of)) { deny(type, sp + ".undone_attempts' must be an object {txn: [attempts]}"); }
          for (var ot in of) {
            var ats = of[ot];
            if (!Array.isArray(ats)) { deny(type, sp + '.undone_attempts.' + ot + "' must be an array of attempts"); }
            for (var n = 0; n < ats.length; n++) {
              if (typeof ats[n] !== 'string' || !/^[0-9a-f]{12}$/.test(ats[n])) {
                deny(type, sp + '.undone_attempts.' + ot + '[' + n + "]' must be 12 lower-case hex digits");
              }
            }
          }
        }
      }
    }
    if (creating) {
      // An account starts as Ledger::create_account writes it: nothing applied, nothing settled.
      if (newDoc.balance !== newDoc.opening) {
        deny(type, "field 'balance' of a new account must equal 'opening' (" + newDoc.opening +
          '), got ' + newDoc.balance);
      }
      if (newDoc.pending.length !== 0) { deny(type, "field 'pending' of a new account must be empty"); }
      if (newDoc.settled.length !== 0) { deny(type, "field 'settled' of a new account must be empty"); }
    }
    if (oldLive) {
      // min_balance too: a writer who could lower it (or make it null, unlimited) could overdraw.
      var fixedA = ['account_id', 'currency', 'opening', 'min_balance'];
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

    // A one-write decision `done` names the attempt of the marker it counts on each account
    // (docs/ONE_WRITE.md): required where `done` is reached that way, by creation or from
    // 'initial'.
    var decided = state === 'done' && (creating || (oldLive && oldDoc.state === 'initial'));
    if (newDoc.markers !== undefined || decided) {
      if (!isObj(newDoc.markers)) {
        deny(type, "field 'markers' must be an object {source, destination} of attempts");
      }
      var roles2 = ['source', 'destination'];
      for (var r = 0; r < roles2.length; r++) {
        var at = newDoc.markers[roles2[r]];
        if (typeof at !== 'string' || !/^[0-9a-f]{12}$/.test(at)) {
          deny(type, "field 'markers." + roles2[r] + "' must be an attempt (12 lower-case hex digits)");
        }
      }
      if (state !== 'done') { deny(type, "field 'markers' belongs to a 'done' transfer only"); }
    }
    if (!oldLive) {
      // A replicated history (an admin's, see above) may start anywhere; a new transfer starts
      // 'initial' or 'pending', or decided at once on the one-write path.
      if (creating && state !== 'initial' && state !== 'pending' && state !== 'done' &&
          state !== 'cancelled') {
        deny(type, "field 'state' of a new transfer must be 'initial', 'pending', 'done' or " +
          "'cancelled', got '" + state + "'");
      }
      if (creating && state === 'cancelled' && !isStr(newDoc.reason)) {
        deny(type, "field 'reason' of a transfer created 'cancelled' must say why");
      }
      return;
    }

    if (oldDoc.state !== 'initial' && !same(newDoc.markers, oldDoc.markers)) {
      deny(type, "field 'markers' is written once, with the decision");
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
      // An interactive write moves one step; a replicated one (an admin's) may bring several
      // steps at once, from the nearest revision this copy holds.
      if (replicated ? !reachable(from, state) : allowed[state] !== true) {
        deny(type, "field 'state' may not change from '" + from + "' to '" + state + "'");
      }
    }
    return;
  }
}
