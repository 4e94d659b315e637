//! The order-ledger commands: purchase, pay, refund, adjust, ship, deliver, order show, orders
//! outstanding, statement. Each validates its input completely before it sends anything.

use std::io::Read;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use couch_ledger::{
    Adjustment, Delivered, OrderBalance, Payment, Purchase, Refund, Shipment, OUTSTANDING_LIMIT_MAX,
};
use serde_json::{json, Value};

use super::meta::{meta_arg, META_HELP};
use super::output::{balance_words, money, money_opt};
use super::parse::{amount, currency};
use super::{Context, Exit, UsageError};

#[derive(Subcommand)]
pub(crate) enum OrderCommand {
    /// Record a purchase from a JSON file in Cloudant's shape (order_id, account_id, basket,
    /// delivery, pretax, tax, total), with decimal amounts like 8.33. Recording the same
    /// purchase again reports "exists"; the same order with other content is refused.
    Purchase(PurchaseArgs),

    /// Record a payment for an order; it takes the balance down. Re-sending the same payment
    /// reports "exists"; the same reference with other content is refused.
    Pay(PayArgs),

    /// Record money given back to the customer; it adds to the balance. When goods come back,
    /// first take them off the order with a negative adjustment (the merchant then owes), and
    /// the refund settles it.
    Refund(RefundArgs),

    /// Record an adjustment of what the customer owes: positive adds (a surcharge), negative
    /// takes away (a discount).
    Adjust(AdjustArgs),

    /// Record that an order was shipped (a status document; no money).
    Ship(ShipArgs),

    /// Record that an order was delivered (a status document; no money).
    Deliver(DeliverArgs),

    /// Look at one order.
    Order {
        #[command(subcommand)]
        command: OrderSub,
    },

    /// Look at many orders.
    Orders {
        #[command(subcommand)]
        command: OrdersSub,
    },

    /// A customer's orders with their balances, and totals per currency.
    Statement(StatementArgs),
}

#[derive(Subcommand)]
pub(crate) enum OrderSub {
    /// An order's total, adjustments, payments, refunds and balance, and its entries, read in
    /// one request.
    Show {
        /// The order id.
        order: String,
        /// Read the order's documents by id instead of the `orders/ledger` view: what a
        /// caller just wrote is counted even on a cluster whose view copies lag
        /// (docs/CLUSTER.md). A few more requests.
        #[arg(long)]
        fresh: bool,
    },
}

#[derive(Subcommand)]
pub(crate) enum OrdersSub {
    /// Orders that are not settled (balance not zero: the customer owes, or the merchant
    /// does), by order id, a page at a time.
    Outstanding(OutstandingArgs),
}

#[derive(Args)]
pub(crate) struct PurchaseArgs {
    /// The JSON file; - reads standard input.
    #[arg(long, value_name = "FILE")]
    file: PathBuf,
    /// The currency of the amounts, when the file has no "currency" field (if both are given
    /// they must agree).
    #[arg(long, value_name = "C")]
    currency: Option<String>,
}

#[derive(Args)]
pub(crate) struct PayArgs {
    /// The order paid for.
    #[arg(long, value_name = "O")]
    order: String,
    /// The payment's reference (e.g. the provider's id); it makes a re-sent payment harmless.
    #[arg(long = "ref", value_name = "R")]
    reference: String,
    /// How much, in the currency's units (6.46); greater than zero.
    #[arg(long, value_name = "A", allow_hyphen_values = true)]
    amount: String,
    /// ISO-4217 code; must be the order's currency.
    #[arg(long, value_name = "C")]
    currency: String,
    /// How it was paid ("credit card", "voucher").
    #[arg(long, value_name = "M")]
    method: Option<String>,
    #[arg(long = "meta", value_name = "KEY=VALUE", help = META_HELP)]
    meta: Vec<String>,
}

#[derive(Args)]
pub(crate) struct RefundArgs {
    /// The order refunded.
    #[arg(long, value_name = "O")]
    order: String,
    /// The refund's reference; it makes a re-sent refund harmless.
    #[arg(long = "ref", value_name = "R")]
    reference: String,
    /// How much, in the currency's units; greater than zero.
    #[arg(long, value_name = "A", allow_hyphen_values = true)]
    amount: String,
    /// ISO-4217 code; must be the order's currency.
    #[arg(long, value_name = "C")]
    currency: String,
    /// Why.
    #[arg(long, value_name = "T")]
    reason: Option<String>,
    #[arg(long = "meta", value_name = "KEY=VALUE", help = META_HELP)]
    meta: Vec<String>,
}

#[derive(Args)]
pub(crate) struct AdjustArgs {
    /// The order adjusted.
    #[arg(long, value_name = "O")]
    order: String,
    /// The adjustment's reference; it makes a re-sent adjustment harmless.
    #[arg(long = "ref", value_name = "R")]
    reference: String,
    /// Signed amount in the currency's units: 2.50 adds, -2.50 takes away; not zero.
    #[arg(long, value_name = "±A", allow_hyphen_values = true)]
    amount: String,
    /// ISO-4217 code; must be the order's currency.
    #[arg(long, value_name = "C")]
    currency: String,
    /// Why.
    #[arg(long, value_name = "T")]
    reason: Option<String>,
    #[arg(long = "meta", value_name = "KEY=VALUE", help = META_HELP)]
    meta: Vec<String>,
}

#[derive(Args)]
pub(crate) struct ShipArgs {
    /// The order shipped.
    #[arg(long, value_name = "O")]
    order: String,
    /// The shipment's reference (a tracking number).
    #[arg(long = "ref", value_name = "R")]
    reference: String,
    /// Who carries it.
    #[arg(long, value_name = "T")]
    carrier: Option<String>,
}

#[derive(Args)]
pub(crate) struct DeliverArgs {
    /// The order delivered.
    #[arg(long, value_name = "O")]
    order: String,
    /// The delivery's reference.
    #[arg(long = "ref", value_name = "R")]
    reference: String,
}

#[derive(Args)]
pub(crate) struct OutstandingArgs {
    /// At most this many orders (1 to 1000).
    #[arg(long, value_name = "N", default_value_t = 100)]
    limit: usize,
    /// Start after this order id (the "next" of the previous page).
    #[arg(long, value_name = "O")]
    after: Option<String>,
}

#[derive(Args)]
pub(crate) struct StatementArgs {
    /// The customer's account id (a purchase's account_id).
    account: String,
}

pub(crate) async fn run(cmd: OrderCommand, ctx: &mut Context) -> anyhow::Result<Exit> {
    match cmd {
        OrderCommand::Purchase(a) => purchase(a, ctx).await,
        OrderCommand::Pay(a) => pay(a, ctx).await,
        OrderCommand::Refund(a) => refund(a, ctx).await,
        OrderCommand::Adjust(a) => adjust(a, ctx).await,
        OrderCommand::Ship(a) => ship(a, ctx).await,
        OrderCommand::Deliver(a) => deliver(a, ctx).await,
        OrderCommand::Order {
            command: OrderSub::Show { order, fresh },
        } => show(&order, fresh, ctx).await,
        OrderCommand::Orders {
            command: OrdersSub::Outstanding(a),
        } => outstanding(a, ctx).await,
        OrderCommand::Statement(a) => statement(&a.account, ctx).await,
    }
}

async fn pay(a: PayArgs, ctx: &mut Context) -> anyhow::Result<Exit> {
    let currency = currency(&a.currency)?;
    let p = Payment {
        order_id: a.order,
        reference: a.reference,
        amount: amount(currency, &a.amount)?,
        currency,
        method: a.method,
        meta: meta_arg(&a.meta)?,
    };
    p.validate()?;
    let r = ctx
        .ledger()?
        .record_payment(&p)
        .await
        .context("could not record the payment")?;
    Ok(ctx.out.recorded("payment", &r)?)
}

async fn refund(a: RefundArgs, ctx: &mut Context) -> anyhow::Result<Exit> {
    let currency = currency(&a.currency)?;
    let r = Refund {
        order_id: a.order,
        reference: a.reference,
        amount: amount(currency, &a.amount)?,
        currency,
        reason: a.reason,
        meta: meta_arg(&a.meta)?,
    };
    r.validate()?;
    let r = ctx
        .ledger()?
        .record_refund(&r)
        .await
        .context("could not record the refund")?;
    Ok(ctx.out.recorded("refund", &r)?)
}

async fn adjust(a: AdjustArgs, ctx: &mut Context) -> anyhow::Result<Exit> {
    let currency = currency(&a.currency)?;
    let adj = Adjustment {
        order_id: a.order,
        reference: a.reference,
        amount: amount(currency, &a.amount)?,
        currency,
        reason: a.reason,
        meta: meta_arg(&a.meta)?,
    };
    adj.validate()?;
    let r = ctx
        .ledger()?
        .record_adjustment(&adj)
        .await
        .context("could not record the adjustment")?;
    Ok(ctx.out.recorded("adjustment", &r)?)
}

async fn ship(a: ShipArgs, ctx: &mut Context) -> anyhow::Result<Exit> {
    let s = Shipment {
        order_id: a.order,
        reference: a.reference,
        carrier: a.carrier,
    };
    s.validate()?;
    let r = ctx
        .ledger()?
        .record_shipment(&s)
        .await
        .context("could not record the shipment")?;
    Ok(ctx.out.recorded("shipment", &r)?)
}

async fn deliver(a: DeliverArgs, ctx: &mut Context) -> anyhow::Result<Exit> {
    let d = Delivered {
        order_id: a.order,
        reference: a.reference,
    };
    d.validate()?;
    let r = ctx
        .ledger()?
        .record_delivery(&d)
        .await
        .context("could not record the delivery")?;
    Ok(ctx.out.recorded("delivery", &r)?)
}

async fn purchase(a: PurchaseArgs, ctx: &mut Context) -> anyhow::Result<Exit> {
    let given = a.currency.as_deref().map(currency).transpose()?;
    let shown = if a.file.as_os_str() == "-" {
        "standard input".to_owned()
    } else {
        a.file.display().to_string()
    };
    let text =
        read_file(&a.file).map_err(|e| UsageError::new(format!("cannot read {shown}: {e}")))?;
    let p = Purchase::from_json(&text, given)
        .with_context(|| format!("the purchase in {shown} is refused"))?;
    let r = ctx
        .ledger()?
        .record_purchase(&p)
        .await
        .context("could not record the purchase")?;
    Ok(ctx.out.recorded("purchase", &r)?)
}

/// A file's text, or standard input's for `-`. Bounded: a purchase is one small document.
fn read_file(path: &std::path::Path) -> std::io::Result<String> {
    const FILE_BYTES_MAX: u64 = 8 * 1024 * 1024;
    let mut text = String::new();
    let read = if path.as_os_str() == "-" {
        std::io::stdin()
            .lock()
            .take(FILE_BYTES_MAX + 1)
            .read_to_string(&mut text)?
    } else {
        std::fs::File::open(path)?
            .take(FILE_BYTES_MAX + 1)
            .read_to_string(&mut text)?
    };
    if read as u64 > FILE_BYTES_MAX {
        return Err(std::io::Error::other(format!(
            "larger than {FILE_BYTES_MAX} bytes"
        )));
    }
    Ok(text)
}

async fn show(order: &str, fresh: bool, ctx: &mut Context) -> anyhow::Result<Exit> {
    let ledger = ctx.ledger()?;
    let s = if fresh {
        ledger.order_fresh(order).await
    } else {
        ledger.order(order).await
    }
    .context("could not read the order")?;
    let entries: Vec<Value> = s
        .entries
        .iter()
        .map(|e| json!({"id": e.id, "type": e.kind.as_str(), "amount": e.amount, "meta": e.meta}))
        .collect();
    let value = json!({
        "order_id": s.order_id,
        "currency": s.currency,
        "total": s.total,
        "adjusted": s.adjusted,
        "paid": s.paid,
        "refunded": s.refunded,
        "balance": s.balance,
        "entries": entries,
    });
    let c = s.currency;
    let m = |a| money(c, a);
    let mut text = format!("order {}\n", s.order_id);
    text.push_str(&format!("  total     {:>16}\n", m(s.total)));
    text.push_str(&format!("  adjusted  {:>16}\n", m(s.adjusted)));
    text.push_str(&format!("  paid      {:>16}\n", m(s.paid)));
    text.push_str(&format!("  refunded  {:>16}\n", m(s.refunded)));
    text.push_str(&format!(
        "  balance   {:>16}  ({})\n",
        m(s.balance),
        balance_words(s.balance)
    ));
    text.push_str("entries\n");
    for e in &s.entries {
        let meta: Vec<String> = e.meta.iter().map(|(k, v)| format!("{k}={v}")).collect();
        text.push_str(&format!(
            "  {:<11} {:>16}  {}{}\n",
            e.kind.as_str(),
            m(e.amount),
            e.id,
            if meta.is_empty() {
                String::new()
            } else {
                format!("  ({})", meta.join(", "))
            }
        ));
    }
    ctx.out.print(&value, &text)?;
    Ok(Exit::Success)
}

fn balances_json(orders: &[OrderBalance]) -> Vec<Value> {
    orders
        .iter()
        .map(|o| json!({"order_id": o.order_id, "currency": o.currency, "balance": o.balance}))
        .collect()
}

async fn outstanding(a: OutstandingArgs, ctx: &mut Context) -> anyhow::Result<Exit> {
    if a.limit == 0 || a.limit > OUTSTANDING_LIMIT_MAX {
        return Err(UsageError::new(format!(
            "--limit must be between 1 and {OUTSTANDING_LIMIT_MAX}"
        ))
        .into());
    }
    let page = ctx
        .ledger()?
        .outstanding_orders(a.limit, a.after.as_deref())
        .await
        .context("could not list the outstanding orders")?;
    let value = json!({"orders": balances_json(&page.orders), "next": page.next});
    let mut text = String::new();
    if page.orders.is_empty() {
        text.push_str("no outstanding orders\n");
    }
    for o in &page.orders {
        text.push_str(&format!(
            "{:<34} {:>16}  ({})\n",
            o.order_id,
            money_opt(o.currency, o.balance),
            balance_words(o.balance)
        ));
    }
    if let Some(next) = &page.next {
        text.push_str(&format!("more: --after {next}\n"));
    }
    ctx.out.print(&value, &text)?;
    Ok(Exit::Success)
}

async fn statement(account: &str, ctx: &mut Context) -> anyhow::Result<Exit> {
    let s = ctx
        .ledger()?
        .customer_statement(account)
        .await
        .context("could not read the statement")?;
    let totals: Vec<Value> = s
        .totals
        .iter()
        .map(|t| json!({"currency": t.currency, "balance": t.balance}))
        .collect();
    let value = json!({
        "account_id": s.account_id,
        "orders": balances_json(&s.orders),
        "totals": totals,
    });
    let mut text = format!("account {}\n", s.account_id);
    if s.orders.is_empty() {
        text.push_str("  no orders\n");
    }
    for o in &s.orders {
        text.push_str(&format!(
            "  {:<34} {:>16}\n",
            o.order_id,
            money_opt(o.currency, o.balance)
        ));
    }
    for t in &s.totals {
        text.push_str(&format!(
            "  {:<34} {:>16}  ({})\n",
            "total",
            money(t.currency, t.balance),
            balance_words(t.balance)
        ));
    }
    ctx.out.print(&value, &text)?;
    Ok(Exit::Success)
}
