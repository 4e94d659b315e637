// A client of `couch-ledger serve` in another language: Node's built-in fetch (Node 18+), no
// packages. It records an order (the Cloudant purchase), pays it in two payments, and moves
// the money from the customer's account to the shop's — re-sending that transfer with the same
// Idempotency-Key to show that a retry never moves money twice.
//
//   couch-ledger serve --listen 127.0.0.1:8080 &
//   LEDGER_URL=http://127.0.0.1:8080 node examples/service-client.mjs
//
// LEDGER_API_KEY is sent as `Authorization: Bearer …` when set. Names get a random suffix
// (RUN_ID to choose it), so the script can run any number of times against one database.
// Exit 0 when every answer was the expected one.

import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { readFile } from 'node:fs/promises';

const base = (process.env.LEDGER_URL ?? 'http://127.0.0.1:8080').replace(/\/$/, '');
const key = process.env.LEDGER_API_KEY;
const run = process.env.RUN_ID ?? randomUUID().slice(0, 8);

// One request: JSON in and out; a 4xx/5xx answer is `{error, message}` and throws.
async function call(method, path, body, headers = {}) {
  const res = await fetch(base + path, {
    method,
    headers: {
      'content-type': 'application/json',
      ...(key ? { authorization: `Bearer ${key}` } : {}),
      ...headers,
    },
    body: body === undefined ? undefined : JSON.stringify(body),
    signal: AbortSignal.timeout(30_000),
  });
  const json = await res.json();
  if (res.status >= 400) {
    throw new Error(`${method} ${path}: ${res.status} ${json.error}: ${json.message}`);
  }
  return { status: res.status, body: json };
}

// Amounts are integers in minor units everywhere but in the purchase, which keeps
// Cloudant's decimals (8.33): the service parses those exactly.
const gbp = (minor) => `${(minor / 100).toFixed(2)} GBP`;

const order = `order-${run}`;
const purchase = JSON.parse(
  await readFile(new URL('./cloudant-purchase.json', import.meta.url), 'utf8'),
);
delete purchase.order_id; // the path names the order

let r = await call('PUT', `/v1/orders/${order}/purchase?currency=GBP`, purchase);
assert.equal(r.status, 201);
console.log(`purchase ${r.body.id}: ${r.body.status}`);

r = await call('GET', `/v1/orders/${order}`);
assert.equal(r.body.balance, 2646);
console.log(`order ${order}: total ${gbp(r.body.total)}, owed ${gbp(r.body.balance)}`);

for (const [ref, amount, method] of [
  ['AB9977G244FF2F667', 646, 'credit card'],
  ['Q88775662377224', 2000, 'voucher'],
]) {
  r = await call('POST', `/v1/orders/${order}/payments`, { ref, amount, currency: 'GBP', method });
  assert.equal(r.status, 201);
  console.log(`payment ${ref} of ${gbp(amount)} by ${method}: ${r.body.status}`);
}
r = await call('GET', `/v1/orders/${order}`);
assert.equal(r.body.balance, 0);
assert.equal(r.body.entries.length, 3);
console.log(`order ${order}: paid ${gbp(r.body.paid)}, owed ${gbp(r.body.balance)} (settled)`);

const customer = `customer-${run}`;
const shop = `shop-${run}`;
await call('POST', '/v1/accounts', { account_id: customer, currency: 'GBP', opening: 5000 });
await call('POST', '/v1/accounts', { account_id: shop, currency: 'GBP', min_balance: null });

const transfer = { from: customer, to: shop, amount: 2646, currency: 'GBP' };
const idempotencyKey = `pay-${order}`;
r = await call('POST', '/v1/transfers', transfer, { 'idempotency-key': idempotencyKey });
assert.equal(r.status, 201);
assert.equal(r.body.state, 'done');
console.log(`transfer ${r.body.id} of ${gbp(transfer.amount)} ${customer} → ${shop}: ${r.body.state}`);

// A retry (say the answer was lost on the way): the same key finds the same transfer.
r = await call('POST', '/v1/transfers', transfer, { 'idempotency-key': idempotencyKey });
assert.equal(r.status, 200);
assert.equal(r.body.status, 'exists');
console.log(`the same transfer re-sent: ${r.body.status}, nothing moved twice`);

// More than the customer has: the transfer ends cancelled, nothing moves.
r = await call('POST', '/v1/transfers', { ...transfer, amount: 1_000_000 });
assert.equal(r.body.state, 'cancelled');
console.log(`a transfer of ${gbp(1_000_000)}: ${r.body.state} (${r.body.reason})`);

const balance = async (id) => (await call('GET', `/v1/accounts/${id}`)).body.balance;
assert.equal(await balance(customer), 5000 - 2646);
assert.equal(await balance(shop), 2646);
console.log(`balances: ${customer} ${gbp(await balance(customer))}, ${shop} ${gbp(await balance(shop))}`);
console.log('ok');
