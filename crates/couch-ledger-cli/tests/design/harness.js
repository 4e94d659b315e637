'use strict';
// Runs couch-ledger's design functions the way CouchDB 3.4's query server (couchjs) runs them,
// for tests/design_functions.rs. Input on stdin, one JSON object:
//   {"design_docs": [{"_id": "_design/x", "views": {...}, "validate_doc_update": "..."}],
//    "cases": [{"new": {...}, "old": {...} | null, "user_ctx": {...}, "sec_obj": {...}}]}
// Output on stdout, one JSON object:
//   {"views": ["transactions/account_balances", ...],
//    "results": [{"validation": {"status": 201 | 401 | 403 | 500, "message": "..."},
//                 "rows": {"transactions/account_balances": [[key, value], ...], ...},
//                 "map_errors": ["view: message"], "log": ["..."]}]}
//
// What makes it CouchDB (share/server/util.js, views.js, validate.js of CouchDB 3.4):
// - every function is compiled in a FRESH context (its own realm: its own Array, Object, ...)
//   whose extra globals are only the sandbox's: emit, sum, log, isArray, toJSON, and JSON —
//   couchjs hands the sandbox its OUTER JSON object;
// - documents, userCtx and secObj are JSON.parse'd OUTSIDE that context, so a document's
//   arrays are not the function's `Array`: `doc.x instanceof Array` is false, as in CouchDB;
// - map: a document is deep-frozen first (Couch.recursivelySeal), deleted documents and design
//   documents are not mapped, a map that throws emits nothing for that document;
// - validate_doc_update(newDoc, oldDoc, userCtx, secObj) is called with the design document as
//   `this`: a thrown {forbidden: m} is 403 m, {unauthorized: m} is 401 m, anything else
//   (a JS error, another object) is an error (500); returning is acceptance (201).
//
// `--same-realm` parses the documents inside each function's own context instead: one realm,
// as pouchdb-server runs design functions. Only the test that shows what the realm changes
// uses it.
var vm = require('vm');
var fs = require('fs');

var sameRealm = process.argv.indexOf('--same-realm') !== -1;
var input = JSON.parse(fs.readFileSync(0, 'utf8'));

var emitted = null; // the rows of the map call running now
var logged = [];

// couchjs: Views.emit, Views.sum, log, isArray (util.js), toJSON = JSON.stringify.
var SANDBOX = {
  emit: function (key, value) {
    if (emitted === null) { throw new Error('emit called outside a map function'); }
    emitted.push([key, value]);
  },
  sum: function (values) {
    var rv = 0;
    for (var i in values) { rv += values[i]; }
    return rv;
  },
  log: function (message) {
    logged.push(typeof message === 'string' ? message : JSON.stringify(message));
  },
  isArray: function (obj) { return Object.prototype.toString.call(obj) === '[object Array]'; },
  toJSON: JSON.stringify,
  JSON: JSON
};

// A fresh realm with the sandbox globals; `parse` parses JSON text into the realm the
// documents come from (outside, unless --same-realm).
function compile(source, name) {
  var context = vm.createContext({});
  var innerParse = vm.runInContext('JSON.parse', context);
  Object.keys(SANDBOX).forEach(function (k) {
    if (k === 'JSON' && sameRealm) { return; }
    context[k] = SANDBOX[k];
  });
  var fn = vm.runInContext('(' + source + '\n)', context, { filename: name });
  if (typeof fn !== 'function') { throw new Error(name + ' is not a function'); }
  return { fn: fn, parse: sameRealm ? innerParse : JSON.parse };
}

function deepFreeze(x) {
  if (typeof x === 'object' && x !== null && !Object.isFrozen(x)) {
    Object.freeze(x);
    Object.keys(x).forEach(function (k) { deepFreeze(x[k]); });
  }
  return x;
}

var maps = [];
var validations = [];
input.design_docs.forEach(function (ddoc) {
  var name = String(ddoc._id).replace(/^_design\//, '');
  var ddocText = JSON.stringify(ddoc);
  Object.keys(ddoc.views || {}).sort().forEach(function (view) {
    var c = compile(ddoc.views[view].map, name + '/' + view + '/map.js');
    maps.push({ view: name + '/' + view, fn: c.fn, parse: c.parse });
  });
  if (typeof ddoc.validate_doc_update === 'string') {
    var c = compile(ddoc.validate_doc_update, name + '/validate_doc_update.js');
    validations.push({ fn: c.fn, parse: c.parse, ddoc: JSON.parse(ddocText) });
  }
});

// couchjs validate.js plus couch_query_servers.erl: the answer to one thrown value.
function refusal(e) {
  if (typeof e === 'object' && e !== null && !(e.name && e.stack)) {
    var keys = Object.keys(e);
    if (keys.length === 1 && keys[0] === 'forbidden') { return { status: 403, message: String(e.forbidden) }; }
    if (keys.length === 1 && keys[0] === 'unauthorized') { return { status: 401, message: String(e.unauthorized) }; }
    return { status: 500, message: 'unknown_error: ' + JSON.stringify(e) };
  }
  return { status: 500, message: String(e && e.stack ? e.stack : e) };
}

function runCase(c) {
  logged = [];
  var text = {
    newDoc: JSON.stringify(c.new),
    oldDoc: JSON.stringify(c.old === undefined ? null : c.old),
    userCtx: JSON.stringify(c.user_ctx),
    secObj: JSON.stringify(c.sec_obj === undefined ? {} : c.sec_obj)
  };
  var validation = { status: 201, message: null };
  for (var i = 0; i < validations.length && validation.status === 201; i++) {
    var v = validations[i];
    try {
      v.fn.call(v.ddoc, v.parse(text.newDoc), v.parse(text.oldDoc), v.parse(text.userCtx), v.parse(text.secObj));
    } catch (e) {
      validation = refusal(e);
    }
  }
  var rows = {};
  var mapErrors = [];
  var mapped = !c.new._deleted && String(c.new._id).indexOf('_design/') !== 0;
  maps.forEach(function (m) {
    rows[m.view] = [];
    if (!mapped) { return; }
    var doc = deepFreeze(m.parse(text.newDoc));
    emitted = [];
    try {
      m.fn(doc);
      // Emitted keys and values leave the query server as JSON (undefined becomes null).
      rows[m.view] = JSON.parse(JSON.stringify(emitted));
    } catch (e) {
      mapErrors.push(m.view + ': ' + String(e && e.stack ? e.stack : e));
    }
    emitted = null;
  });
  return { validation: validation, rows: rows, map_errors: mapErrors, log: logged };
}

var out = {
  views: maps.map(function (m) { return m.view; }),
  results: input.cases.map(runCase)
};
process.stdout.write(JSON.stringify(out));
