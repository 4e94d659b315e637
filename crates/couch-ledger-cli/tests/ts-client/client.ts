// A client of `couch-ledger serve` in TypeScript, generated from the service's own OpenAPI
// document: openapi-typescript turns GET /openapi.json into `schema.d.ts`, and openapi-fetch
// checks every path, parameter, body and answer against it at compile time (`tsc`). The flow is
// examples/service-client.mjs's: record an order, pay it, open two accounts and move the money,
// re-sending the transfer with the same Idempotency-Key to show it never moves twice.
//
//   npx openapi-typescript http://127.0.0.1:8080/openapi.json -o schema.d.ts
//   npx tsc && LEDGER_URL=http://127.0.0.1:8080 PURCHASE_FILE=../../../../examples/cloudant-purchase.json node dist/client.js
//
// LEDGER_API_KEY is sent as `Authorization: Bearer …` when set; RUN_ID suffixes the names.
// Exit 0 when every answer was the expected one.

import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { readFile } from 'node:fs/promises';

import createClient from 'openapi-fetch';

import type { components, paths } from './schema.js';

type Schemas = components['schemas'];

const base = (process.env.LEDGER_URL ?? 'http://127.0.0.1:8080').replace(/\/$/, '');
const key = process.env.LEDGER_API_KEY;
const run = process.env.RUN_ID ?? randomUUID().slice(0, 8);
const purchaseFile = process.env.PURCHASE_FILE ?? '../../../../examples/cloudant-purchase.json';

const ledger = createClient<paths>({
  baseUrl: base,
  headers: key ? { authorization: `Bearer ${key}` } : {},
});

// What a call came to: its body, or the service's ErrorBody thrown.
function answered<T>(
  what: string,
  r: { data?: T; error?: Schemas['ErrorBody']; response: Response },
): { status: number; body: T } {
  if (r.data === undefined) {
    throw new Error(`${what}: ${r.response.status} ${r.error?.error}: ${r.error?.message}`);
  }
  return { status: r.response.status, body: r.data };
}

// Amounts are integers in minor units everywhere but in the purchase, which keeps Cloudant's
// decimals (8.33): the service parses those exactly.
const gbp = (minor: number) => `${(minor / 100).toFixed(2)} GBP`;

const order = `order-${run}`;
const { order_id: _named, ...purchase }: Schemas['PurchaseBody'] = JSON.parse(
  await readFile(purchaseFile, 'utf8'),
);
const recorded = answered(
  'purchase',
  await ledger.PUT('/v1/orders/{order_id}/purchase', {
    params: { path: { order_id: order }, query: { currency: 'GBP' } },
    body: purchase,
  }),
);
assert.equal(recorded.status, 201);
const created: Schemas['RecordStatusBody'] = recorded.body.status;
console.log(`purchase ${recorded.body.id}: ${created}`);

const show = async () =>
  answered(
    'order',
    await ledger.GET('/v1/orders/{order_id}', { params: { path: { order_id: order } } }),
  ).body;
let shown: Schemas['OrderBody'] = await show();
assert.equal(shown.balance, 2646);
console.log(`order ${order}: total ${gbp(shown.total)}, owed ${gbp(shown.balance)}`);

const payments: [string, number, string][] = [
  ['AB9977G244FF2F667', 646, 'credit card'],
  ['Q88775662377224', 2000, 'voucher'],
];
for (const [ref, amount, method] of payments) {
  const paid = answered(
    'payment',
    await ledger.POST('/v1/orders/{order_id}/payments', {
      params: { path: { order_id: order } },
      body: { ref, amount, currency: 'GBP', method },
    }),
  );
  assert.equal(paid.status, 201);
  console.log(`payment ${ref} of ${gbp(amount)} by ${method}: ${paid.body.status}`);
}
shown = await show();
assert.equal(shown.balance, 0);
assert.deepEqual(
  shown.entries.map((e) => e.type),
  ['purchase', 'payment', 'payment'],
);
console.log(`order ${order}: paid ${gbp(shown.paid)}, owed ${gbp(shown.balance)} (settled)`);

const customer = `customer-${run}`;
const shop = `shop-${run}`;
for (const body of [
  { account_id: customer, currency: 'GBP', opening: 5000 },
  { account_id: shop, currency: 'GBP', min_balance: null },
] satisfies Schemas['CreateAccount'][]) {
  const opened = answered('account', await ledger.POST('/v1/accounts', { body }));
  assert.equal(opened.body.account, body.account_id);
}

const transfer: Schemas['CreateTransfer'] = {
  from: customer,
  to: shop,
  amount: 2646,
  currency: 'GBP',
};
const idempotencyKey = `pay-${order}`;
const send = async (body: Schemas['CreateTransfer']) =>
  answered(
    'transfer',
    await ledger.POST('/v1/transfers', {
      params: { header: { 'Idempotency-Key': idempotencyKey } },
      body,
    }),
  );
let moved = await send(transfer);
assert.equal(moved.status, 201);
const state: Schemas['StateBody'] = moved.body.state;
assert.equal(state, 'done');
console.log(`transfer ${moved.body.id} of ${gbp(transfer.amount)} ${customer} → ${shop}: ${state}`);

// A retry (say the answer was lost on the way): the same key finds the same transfer.
moved = await send(transfer);
assert.equal(moved.status, 200);
assert.equal(moved.body.status, 'exists');
console.log(`the same transfer re-sent: ${moved.body.status}, nothing moved twice`);

// More than the customer has: the transfer ends cancelled, nothing moves.
const tooMuch = answered(
  'transfer',
  await ledger.POST('/v1/transfers', { body: { ...transfer, amount: 1_000_000 } }),
);
assert.equal(tooMuch.body.state, 'cancelled');
console.log(`a transfer of ${gbp(1_000_000)}: ${tooMuch.body.state} (${tooMuch.body.reason})`);

// An error is typed too: the service's ErrorBody.
const missing = await ledger.GET('/v1/accounts/{id}', {
  params: { path: { id: `nobody-${run}` } },
});
assert.equal(missing.response.status, 404);
assert.equal(missing.error?.error, 'not_found');

const balance = async (id: string) =>
  answered('account', await ledger.GET('/v1/accounts/{id}', { params: { path: { id } } })).body
    .balance;
assert.equal(await balance(customer), 5000 - 2646);
assert.equal(await balance(shop), 2646);
console.log(`balances: ${customer} ${gbp(await balance(customer))}, ${shop} ${gbp(await balance(shop))}`);
console.log('ok');
