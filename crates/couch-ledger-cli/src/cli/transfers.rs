//! Accounts, multi-phase transfers and the sweeper on the command line: account create / show /
//! list, transfer (and transfer show), cancel, reverse, sweep, status, verify. Each validates
//! its input completely before it sends anything; docs/PROTOCOL.md is the contract for the flags,
//! the `--json` fields and the exit codes.

use std::fmt;
use std::io::Write as _;

use anyhow::Context as _;
use clap::{ArgGroup, Args, Subcommand};
use couch_ledger::limits::{STALE_AFTER_DEFAULT_MS, SWEEP_LIMIT_MAX};
use couch_ledger::{
    format_time_ms, AccountSpec, Amount, Currency, RecordStatus, State, SweepOptions, SweepOutcome,
    TransferOutcome, TransferRequest, TransitionError, VerifyOptions,
};
use serde_json::{json, Value};

use super::history::time_arg;
use super::lookup::{money_in, or_missing};
use super::meta::{meta_arg, meta_words, TransferListArgs, META_HELP};
use super::output::{money, sweep_words};
use super::parse::{amount, currency, parse_duration};
use super::{Context, Exit, UsageError};

// `sweep` shows the default as whole seconds ("30s").
const _: () = assert!(STALE_AFTER_DEFAULT_MS.is_multiple_of(1000));

#[derive(Subcommand)]
pub(crate) enum TransferCommand {
    /// Create, show or list accounts (the documents transfers move money between).
    Account {
        #[command(subcommand)]
        command: AccountSub,
    },

    /// Move money from one account to another: both accounts take a pending marker, then the
    /// transfer is decided by one write of its document, done or cancelled (docs/ONE_WRITE.md),
    /// before returning; with --no-wait it is left initial for the sweeper. Re-sending the same
    /// --id with the same terms reports the transfer ("exists") instead of making a second one.
    ///
    /// Exit codes: 0 done (or, with --no-wait or after a lost lease, still in progress: the
    /// sweeper finishes it); 3 cancelled by a business rule (insufficient_funds,
    /// unknown_account, currency_mismatch; or, for a re-sent --id, by an earlier `cancel`) —
    /// nothing moved; 2 invalid input (same account on
    /// both sides, an amount that is not positive or not exact in the currency, an unknown
    /// currency, a bad id, an --id re-used with other terms) — nothing written; 1 operational
    /// error (server, network).
    ///
    /// `transfer show TXN` reads one transfer.
    #[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
    Transfer(TransferArgs),

    /// Cancel a transfer that is not committed yet: from initial straight to cancelled; from
    /// pending through canceling, undoing whatever it applied. Cancelling a cancelled transfer
    /// reports it as it is. A committed or done transfer cannot be cancelled (exit 2): reverse
    /// it. An unknown transfer is exit 2.
    Cancel(TxnArg),

    /// Undo a committed or done transfer with a new transfer in the other direction, id
    /// rev-TXN, driven to its end. Its id is derived from the original, so reversing again
    /// reports the first reversal ("exists") and never moves the money twice. Exit codes as for
    /// `transfer` (3 when the reversal is cancelled, e.g. the money was spent); a transfer that
    /// is not committed or done, or unknown, is exit 2.
    Reverse(TxnArg),

    /// Finish transfers that stopped half-way (a crashed or slow writer): each open transfer
    /// untouched for --stale-after whose claim has expired is taken over and driven to done or
    /// cancelled; pending markers left behind on accounts are repaired. Either one pass
    /// (--once; exit 1 when a transfer could not be driven) or until SIGINT / SIGTERM (--watch:
    /// the current step is finished, the totals printed, exit 0).
    #[command(group(ArgGroup::new("mode").required(true).args(["once", "watch"])))]
    Sweep(SweepArgs),

    /// Transfers per state, the age of the oldest open one, and the money in flight (the sum of
    /// the `transactions/pending` view, in minor units over all currencies).
    Status,

    /// Check the ledger's invariants (docs/PROTOCOL.md: conservation, exactly-once, no overdraft,
    /// termination, no stale pending markers, immutable documents) and print the figures
    /// behind each verdict. Exit 1 when any does not hold.
    Verify(VerifyArgs),
}

#[derive(Subcommand)]
pub(crate) enum AccountSub {
    /// Create an account. Creating it again with the same currency, opening and minimum
    /// reports "exists"; with other values it is refused (exit 2).
    Create(AccountCreateArgs),

    /// An account's balances and the transfers applied to it and not yet settled. `balance` is
    /// what the document stores, `available` leaves out credits that could still be rolled
    /// back, `posted` leaves out every unsettled transfer. An unknown account is exit 2.
    ///
    /// With --at T, also the balance as of T: the opening plus every committed or done
    /// transfer that took effect at or before T (read from a view, which may lag a moment
    /// behind the latest transfers), in `--json` as `as_of: {at, balance}` beside the current
    /// fields. A bad T is exit 2.
    Show {
        /// The account id.
        account: String,
        /// The balance as of this time: RFC 3339 (2025-11-22T08:00:00Z, with an offset or
        /// fractions of a second) or milliseconds since the Unix epoch.
        #[arg(long, value_name = "T")]
        at: Option<String>,
    },

    /// The transfers that moved money on an account, newest first: each committed or done
    /// transfer (reversals too, marked), when it took effect, what it did to the account
    /// (−amount as the source, +amount as the destination) and the balance right after it.
    /// Cancelled transfers moved nothing and are left out. A page at a time: the last line
    /// (`next` with --json) gives the --after that goes on. Read from a view, which may lag a
    /// moment behind the latest transfers. An unknown account, a bad time or --limit is exit 2.
    History(super::history::HistoryArgs),

    /// Every account with its balances.
    List,
}

#[derive(Args)]
pub(crate) struct AccountCreateArgs {
    /// The account id (no ':', not beginning with '_').
    account: String,
    /// ISO-4217 code; never changes.
    #[arg(long, value_name = "C")]
    currency: String,
    /// Opening balance in the currency's units (1000.00) [default: 0].
    #[arg(long, value_name = "A", allow_hyphen_values = true)]
    opening: Option<String>,
    /// The lowest balance a debit may leave, in the currency's units [default: 0].
    #[arg(
        long,
        value_name = "A",
        allow_hyphen_values = true,
        conflicts_with = "unlimited"
    )]
    min_balance: Option<String>,
    /// No minimum: the balance may go below zero (an issuer or external account).
    #[arg(long)]
    unlimited: bool,
    #[arg(long = "meta", value_name = "KEY=VALUE", help = META_HELP)]
    meta: Vec<String>,
}

#[derive(Args)]
pub(crate) struct TransferArgs {
    #[command(subcommand)]
    show: Option<TransferSub>,
    /// The account debited.
    #[arg(long, value_name = "A", required = true)]
    from: Option<String>,
    /// The account credited; not the same as --from.
    #[arg(long, value_name = "B", required = true)]
    to: Option<String>,
    /// How much, in the currency's units (100, 6.46); greater than zero.
    #[arg(long, value_name = "A", required = true, allow_hyphen_values = true)]
    amount: Option<String>,
    /// ISO-4217 code; both accounts must hold it, or the transfer is cancelled
    /// (currency_mismatch).
    #[arg(long, value_name = "C", required = true)]
    currency: Option<String>,
    /// Idempotency key, the transfer's id: sending it again never makes a second transfer
    /// [default: a new UUID v7].
    #[arg(long, value_name = "KEY")]
    id: Option<String>,
    /// Only write the transfer (state initial) and return: `sweep` carries it out.
    #[arg(long)]
    no_wait: bool,
    #[arg(long = "meta", value_name = "KEY=VALUE", help = META_HELP)]
    meta: Vec<String>,
}

#[derive(Subcommand)]
pub(crate) enum TransferSub {
    /// One transfer: its terms, state, reason, claim, when it was decided and its metadata.
    /// An unknown transfer is exit 2.
    Show(TxnArg),
    /// The transfers whose metadata holds KEY=VALUE, newest first (by creation), a page at a
    /// time: the last line (`next` with --json) gives the --after that goes on. Read from a
    /// view, which may lag a moment behind the latest transfers. A bad pair, cursor or --limit
    /// is exit 2.
    List(TransferListArgs),
}

#[derive(Args)]
pub(crate) struct TxnArg {
    /// The transfer id.
    txn: String,
}

#[derive(Args)]
pub(crate) struct SweepArgs {
    /// One bounded pass, then print what it did and exit.
    #[arg(long)]
    once: bool,
    /// Keep sweeping, woken by changes to transfers (and at least every stale-after / 2,
    /// within 0.1 s to 30 s), until SIGINT or SIGTERM; progress lines go to stderr.
    #[arg(long)]
    watch: bool,
    /// Take over only transfers untouched for this long: 0s, 500ms, 30s, 5m [default: 30s].
    #[arg(long, value_name = "DUR")]
    stale_after: Option<String>,
    /// At most N transfers (and N pending markers) per pass, 1 to 100000.
    #[arg(long, value_name = "N", default_value_t = 1000)]
    batch: usize,
}

#[derive(Args)]
pub(crate) struct VerifyArgs {
    /// Expect the ledger at rest (no writer or sweeper running): no open transfer and no
    /// pending marker at all, and exactly-once checked strictly. Without it, transfers in
    /// flight younger than 5 minutes are allowed.
    #[arg(long)]
    at_rest: bool,
}

pub(crate) async fn run(cmd: TransferCommand, ctx: &mut Context) -> anyhow::Result<Exit> {
    match cmd {
        TransferCommand::Account {
            command: AccountSub::Create(a),
        } => account_create(a, ctx).await,
        TransferCommand::Account {
            command: AccountSub::Show { account, at },
        } => account_show(&account, at.as_deref(), ctx).await,
        TransferCommand::Account {
            command: AccountSub::History(a),
        } => super::history::history(a, ctx).await,
        TransferCommand::Account {
            command: AccountSub::List,
        } => account_list(ctx).await,
        TransferCommand::Transfer(TransferArgs {
            show: Some(TransferSub::Show(a)),
            ..
        }) => transfer_show(&a.txn, ctx).await,
        TransferCommand::Transfer(TransferArgs {
            show: Some(TransferSub::List(a)),
            ..
        }) => super::meta::list(a, ctx).await,
        TransferCommand::Transfer(a) => transfer(a, ctx).await,
        TransferCommand::Cancel(a) => cancel(&a.txn, ctx).await,
        TransferCommand::Reverse(a) => reverse(&a.txn, ctx).await,
        TransferCommand::Sweep(a) => sweep(a, ctx).await,
        TransferCommand::Status => status(ctx).await,
        TransferCommand::Verify(a) => verify(a, ctx).await,
    }
}

// ---- accounts -------------------------------------------------------------------------------

async fn account_create(a: AccountCreateArgs, ctx: &mut Context) -> anyhow::Result<Exit> {
    let c = currency(&a.currency)?;
    let opening = match &a.opening {
        Some(text) => amount(c, text).context("--opening")?,
        None => Amount::ZERO,
    };
    let min_balance = if a.unlimited {
        None
    } else {
        Some(match &a.min_balance {
            Some(text) => amount(c, text).context("--min-balance")?,
            None => Amount::ZERO,
        })
    };
    let spec = AccountSpec {
        account_id: a.account.clone(),
        currency: c,
        opening,
        min_balance,
        meta: meta_arg(&a.meta)?,
    };
    let r = ctx
        .ledger()?
        .create_account(spec)
        .await
        .with_context(|| format!("could not create account {}", a.account))?;
    let terms = format!(
        "{c}, opening {}, {}",
        money(c, opening),
        match min_balance {
            Some(m) => format!("minimum {}", money(c, m)),
            None => "no minimum".to_owned(),
        }
    );
    let text = match r.status {
        RecordStatus::Created | RecordStatus::Uncertain => {
            format!("account {} created ({terms})", a.account)
        }
        RecordStatus::Exists => format!(
            "account {} exists with the same terms ({terms}); nothing written",
            a.account
        ),
    };
    ctx.out.print(
        &json!({"id": r.id, "status": r.status.as_str(), "account": a.account}),
        &text,
    )?;
    Ok(Exit::Success)
}

/// `account show A [--at T]`: with `at`, the balance as of then (`as_of`) beside the account
/// as it is now.
async fn account_show(account: &str, at: Option<&str>, ctx: &mut Context) -> anyhow::Result<Exit> {
    let at = at.map(|text| time_arg("at", text)).transpose()?;
    let ledger = ctx.ledger()?;
    let read = match at {
        None => ledger.account(account).await.map(|view| (view, None)),
        Some(at) => {
            (ledger.balance_at(account, at).await).map(|b| (b.account, Some((b.at, b.balance))))
        }
    };
    let (view, as_of) = read.map_err(|e| {
        or_missing(
            e,
            format!(
                "no account {account:?} in database {}",
                ctx.settings.accounts_db()
            ),
            format!("could not read account {account}"),
        )
    })?;
    let m = money_in(&view.currency);
    let mut text = format!("account {} ({})\n", view.account, view.currency);
    if let Some((at, then)) = as_of {
        text.push_str(&format!(
            "  as of {}: {}  (committed and done transfers up to then)\n  now\n",
            format_time_ms(at),
            m(then)
        ));
    }
    text.push_str(&format!("  balance    {:>18}\n", m(view.balance)));
    text.push_str(&format!(
        "  available  {:>18}  (without credits not yet settled)\n",
        m(view.available)
    ));
    text.push_str(&format!(
        "  posted     {:>18}  (settled transfers only)\n",
        m(view.posted)
    ));
    text.push_str(&format!(
        "  minimum    {:>18}\n",
        view.min_balance.map_or("unlimited".to_owned(), &m)
    ));
    text.push_str(&format!("  opening    {:>18}\n", m(view.opening)));
    text.push_str(&meta_words(&view.meta));
    if view.pending.is_empty() {
        text.push_str("  no transfer pending\n");
    } else {
        text.push_str("  pending transfers (applied, not settled)\n");
        for p in &view.pending {
            text.push_str(&format!("    {:>18}  {}\n", m(p.delta), p.txn));
        }
    }
    let mut value = serde_json::to_value(&view)?;
    if let Some((at, balance)) = as_of {
        value["as_of"] = json!({"at": at, "balance": balance});
    }
    ctx.out.print(&value, &text)?;
    Ok(Exit::Success)
}

async fn account_list(ctx: &mut Context) -> anyhow::Result<Exit> {
    let accounts = ctx
        .ledger()?
        .all_accounts()
        .await
        .context("could not list the accounts")?;
    let mut text = String::new();
    if accounts.is_empty() {
        text.push_str("no accounts\n");
    } else {
        text.push_str(&format!(
            "{:<24} {:>18} {:>18} {:>18}  pending\n",
            "account", "balance", "available", "minimum"
        ));
    }
    for view in &accounts {
        let m = money_in(&view.currency);
        text.push_str(&format!(
            "{:<24} {:>18} {:>18} {:>18}  {}\n",
            view.account,
            m(view.balance),
            m(view.available),
            view.min_balance.map_or("unlimited".to_owned(), &m),
            view.pending.len()
        ));
    }
    ctx.out.print(
        &json!({"accounts": serde_json::to_value(&accounts)?}),
        &text,
    )?;
    Ok(Exit::Success)
}

// ---- transfers ------------------------------------------------------------------------------

/// The exit code a transfer's outcome means: 3 when it ended cancelled or is being cancelled
/// (nothing will move), else 0 (done, or still in progress for the sweeper to finish).
fn transfer_exit(state: State) -> Exit {
    match state {
        // A transfer left canceling can only end cancelled: nothing will move.
        State::Cancelled | State::Canceling => Exit::Cancelled,
        State::Initial | State::Pending | State::Committed | State::Done => Exit::Success,
    }
}

/// One line about where a transfer stands, for people.
fn state_words(o: &TransferOutcome) -> String {
    let reason = o.reason.as_deref().unwrap_or("no reason recorded");
    match o.state {
        State::Done => "done".to_owned(),
        State::Cancelled => format!("cancelled ({reason}): nothing moved"),
        State::Initial => {
            "initial: written, not started; `couch-ledger sweep` will carry it out".to_owned()
        }
        State::Pending | State::Committed => format!(
            "{}: in progress; the sweeper will finish it",
            o.state.as_str()
        ),
        State::Canceling => {
            format!("canceling ({reason}): in progress; the sweeper will finish it")
        }
    }
}

fn outcome_json(o: &TransferOutcome) -> Value {
    json!({"id": o.id, "state": o.state.as_str(), "reason": o.reason, "status": o.status.as_str()})
}

async fn transfer(a: TransferArgs, ctx: &mut Context) -> anyhow::Result<Exit> {
    // clap requires these without a subcommand.
    let (Some(from), Some(to), Some(amount_text), Some(code)) =
        (a.from, a.to, a.amount, a.currency)
    else {
        return Err(UsageError::new("--from, --to, --amount and --currency are required").into());
    };
    let c = currency(&code)?;
    let value = amount(c, &amount_text)?;
    if !value.is_positive() {
        return Err(UsageError::new(format!(
            "--amount must be greater than zero, not {amount_text}"
        ))
        .into());
    }
    if from == to {
        return Err(UsageError::new(format!(
            "--from and --to are both {from:?}: a transfer needs two accounts"
        ))
        .into());
    }
    // The id is made here, before anything is written, so that whatever happens next the user
    // knows which transfer to look for or to send again.
    let id = a.id.unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
    let request = TransferRequest {
        id: Some(id),
        source: from.clone(),
        destination: to.clone(),
        amount: value,
        currency: c,
        meta: meta_arg(&a.meta)?,
    };
    // One transfer per process: a look first keeps a re-sent --id from touching the accounts.
    let ledger = ctx.ledger_with(|b| b.lookup_first(true))?;
    let o = match ledger.submit(request, !a.no_wait).await {
        Ok(o) => o,
        Err(e) => {
            // A missing database (no `init`, a wrong --db) refused the first write: nothing
            // exists; `failure::explain` says what to run.
            if e.transfer_id().is_none() || e.is_missing_database() {
                return Err(anyhow::Error::new(e).context("the transfer could not be made"));
            }
            return Err(Unfinished(e).into());
        }
    };
    let text = format!(
        "transfer {} of {} from {from} to {to}{}: {}",
        o.id,
        money(c, value),
        match o.status {
            RecordStatus::Created | RecordStatus::Uncertain => "",
            RecordStatus::Exists => " (exists: sent before with the same terms)",
        },
        state_words(&o)
    );
    ctx.out.print(&outcome_json(&o), &text)?;
    Ok(transfer_exit(o.state))
}

async fn transfer_show(txn: &str, ctx: &mut Context) -> anyhow::Result<Exit> {
    let ledger = ctx.ledger()?;
    let t = ledger.transfer(txn).await.map_err(|e| {
        or_missing(
            e,
            format!(
                "no transfer {txn:?} in database {}",
                ctx.settings.accounts_db()
            ),
            format!("could not read transfer {txn}"),
        )
    })?;
    let c = Currency::from_code(&t.currency).ok();
    let mut text = format!(
        "transfer {} ({} from {} to {}): {}\n",
        t.id,
        super::output::money_opt(c, t.amount),
        t.source,
        t.destination,
        t.state,
    );
    if let Some(r) = &t.reason {
        text.push_str(&format!("  reason     {r}\n"));
    }
    if let Some(r) = &t.reverses {
        text.push_str(&format!("  reverses   {r}\n"));
    }
    if let Some(claim) = &t.claim {
        text.push_str(&format!(
            "  claimed by {} until {} (ms since the epoch)\n",
            claim.owner, claim.expires_at
        ));
    }
    if let Some(at) = t.decided_at {
        text.push_str(&format!("  decided    {}\n", format_time_ms(at)));
    }
    text.push_str(&meta_words(&t.meta));
    ctx.out.print(&serde_json::to_value(&t)?, &text)?;
    Ok(Exit::Success)
}

async fn cancel(txn: &str, ctx: &mut Context) -> anyhow::Result<Exit> {
    let ledger = ctx.ledger()?;
    let o = match ledger.cancel(txn).await {
        Ok(o) => o,
        Err(e) => {
            let refused = match e.transition() {
                Some(TransitionError::AlreadyDone) => Some("done"),
                Some(TransitionError::AlreadyCommitted) => Some("committed"),
                _ => None,
            };
            if let Some(state) = refused {
                return Err(UsageError::new(format!(
                    "transfer {txn} is {state}: it cannot be cancelled; reverse it instead \
                     (couch-ledger reverse {txn})"
                ))
                .into());
            }
            return Err(or_missing(
                e,
                format!(
                    "no transfer {txn:?} in database {}",
                    ctx.settings.accounts_db()
                ),
                format!("could not cancel transfer {txn}"),
            ));
        }
    };
    let text = format!("transfer {}: {}", o.id, state_words(&o));
    ctx.out.print(&outcome_json(&o), &text)?;
    Ok(Exit::Success)
}

async fn reverse(txn: &str, ctx: &mut Context) -> anyhow::Result<Exit> {
    let ledger = ctx.ledger()?;
    let o = ledger.reverse(txn).await.map_err(|e| {
        or_missing(
            e,
            format!(
                "no transfer {txn:?} in database {}",
                ctx.settings.accounts_db()
            ),
            format!("could not reverse transfer {txn}"),
        )
    })?;
    let text = format!(
        "reversal {} of transfer {txn}{}: {}",
        o.id,
        match o.status {
            RecordStatus::Created | RecordStatus::Uncertain => "",
            RecordStatus::Exists => " (exists: it was reversed before; nothing moved again)",
        },
        state_words(&o)
    );
    let mut value = outcome_json(&o);
    value["reverses"] = json!(txn);
    ctx.out.print(&value, &text)?;
    Ok(transfer_exit(o.state))
}

// ---- the sweeper ----------------------------------------------------------------------------

fn sweep_json(s: &SweepOutcome) -> Value {
    json!({
        "examined": s.examined,
        "advanced": s.advanced,
        "cancelled": s.cancelled,
        "skipped": s.skipped,
        "failed": s.failed,
        "remaining": s.remaining,
        "repaired_markers": s.repaired_markers,
        "skipped_malformed": s.skipped_malformed,
        "conflicts_resolved": s.conflicts_resolved,
        "conflicts_unresolved": s.conflicts_unresolved,
        "problems": s.problems,
    })
}

async fn sweep(a: SweepArgs, ctx: &mut Context) -> anyhow::Result<Exit> {
    let stale_after_text = a
        .stale_after
        .clone()
        .unwrap_or_else(|| format!("{}s", STALE_AFTER_DEFAULT_MS / 1000));
    let stale_after = parse_duration(&stale_after_text)
        .map_err(|e| UsageError::new(format!("--stale-after: {e}")))?;
    if a.batch == 0 || a.batch > SWEEP_LIMIT_MAX {
        return Err(
            UsageError::new(format!("--batch must be between 1 and {SWEEP_LIMIT_MAX}")).into(),
        );
    }
    let options = SweepOptions {
        limit: a.batch,
        stale_after,
    };
    let ledger = ctx.ledger()?;
    if a.once {
        let bar = super::progress::Bar::new(ctx.out.is_json(), "sweeping", Some(0));
        let ledger = match bar.hook() {
            Some(hook) => ledger.to_builder().progress(hook).build()?,
            None => ledger,
        };
        let swept = ledger.sweep_once(options).await;
        bar.finish();
        let s = swept.context("the sweep could not run")?;
        let mut text = format!("swept once: {}\n", sweep_words(&s));
        if s.remaining > 0 {
            // Right after `transfer --no-wait` a transfer is open but not stale: say why it was
            // left, rather than let "still open" read as a failure.
            text.push_str(&format!(
                "  open transfers are taken over once untouched for --stale-after \
                 ({stale_after_text}): until then their writer may still be at work \
                 (--stale-after 0s takes them now)\n"
            ));
        }
        for p in &s.problems {
            text.push_str(&format!("  problem: {p}\n"));
        }
        ctx.out.print(&sweep_json(&s), &text)?;
        // A drive that failed (server, network, lease ran out) left work undone.
        return Ok(if s.failed > 0 {
            Exit::Operational
        } else {
            Exit::Success
        });
    }
    debug_assert!(a.watch, "clap requires --once or --watch");
    // Installed before the first pass, so a signal at any moment stops us cleanly.
    let signals = super::shutdown_signal().context("cannot install the signal handlers")?;
    let shutdown = async move {
        signals.await;
        let _ = writeln!(std::io::stderr(), "stopping: finishing the current step");
    };
    let _ = writeln!(
        std::io::stderr(),
        "sweeping (stale after {stale_after_text}, batch {}); SIGINT or SIGTERM stops after the \
         current step",
        a.batch
    );
    let totals = ledger
        .sweep_watch_with(options, shutdown, |pass| {
            if pass.advanced + pass.cancelled + pass.failed + pass.repaired_markers > 0 {
                let _ = writeln!(std::io::stderr(), "sweep pass: {}", sweep_words(pass));
            }
        })
        .await
        .context("the sweeper could not run")?;
    let mut text = format!("stopped; in total: {}\n", sweep_words(&totals));
    for p in &totals.problems {
        text.push_str(&format!("  problem: {p}\n"));
    }
    ctx.out.print(&sweep_json(&totals), &text)?;
    Ok(Exit::Success)
}

async fn status(ctx: &mut Context) -> anyhow::Result<Exit> {
    let s = ctx
        .ledger()?
        .status()
        .await
        .context("could not read the ledger's status")?;
    let mut text = String::from("transfers by state\n");
    for state in State::ALL {
        text.push_str(&format!(
            "  {:<10} {:>10}\n",
            state.as_str(),
            s.states.get(state)
        ));
    }
    text.push_str(&match s.oldest_open_age_s {
        Some(age) => format!("oldest open transfer: last written {age} s ago\n"),
        None => "no open transfer\n".to_owned(),
    });
    if s.in_flight_by_currency.is_empty() {
        text.push_str("money in flight (pending transfers): none\n");
    }
    for (code, amount) in &s.in_flight_by_currency {
        let shown = match Currency::from_code(code) {
            Ok(c) => money(c, *amount),
            Err(_) => format!("{} minor units of {code}", amount.minor()),
        };
        text.push_str(&format!("money in flight (pending transfers): {shown}\n"));
    }
    text.push_str(&format!(
        "pending markers on accounts: {}\n",
        s.pending_markers
    ));
    text.push_str(&format!(
        "ledger documents holding a conflict: {}\naccounts below their minimum balance: {}\n",
        s.conflicts, s.overdrawn
    ));
    let value = json!({
        "states": serde_json::to_value(s.states)?,
        "oldest_open_age_s": s.oldest_open_age_s,
        "in_flight": s.in_flight,
        "in_flight_by_currency": s.in_flight_by_currency,
        "pending_markers": s.pending_markers,
        "conflicts": s.conflicts,
        "overdrawn": s.overdrawn,
    });
    ctx.out.print(&value, &text)?;
    Ok(Exit::Success)
}

async fn verify(a: VerifyArgs, ctx: &mut Context) -> anyhow::Result<Exit> {
    let options = if a.at_rest {
        VerifyOptions::at_rest()
    } else {
        VerifyOptions::default()
    };
    let mut ledger = ctx.ledger()?;
    let mut bar = super::progress::Bar::new(ctx.out.is_json(), "reading documents", None);
    if bar.is_on() {
        // The bar's length: every document and deletion, which `_changes` lists once each.
        let mut infos = vec![ledger.client().database_info().await.unwrap_or_default()];
        if ledger.hot_database().is_some() {
            infos.push(
                ledger
                    .hot_client()
                    .database_info()
                    .await
                    .unwrap_or_default(),
            );
        }
        let count = |k: &str| -> Option<u64> {
            infos
                .iter()
                .map(|info| info.get(k).and_then(serde_json::Value::as_u64))
                .sum()
        };
        if let Some(docs) = count("doc_count") {
            bar.finish();
            let total = docs + count("doc_del_count").unwrap_or(0);
            bar = super::progress::Bar::new(false, "reading documents", Some(total));
        }
    }
    if let Some(hook) = bar.hook() {
        ledger = ledger.to_builder().progress(hook).build()?;
    }
    let verified = ledger.verify_with(options).await;
    bar.finish();
    let report = verified.context("could not verify the ledger")?;
    let mut text = String::new();
    for c in &report.checks {
        text.push_str(&format!(
            "{:<4}  {:<20} {}\n",
            if c.ok { "ok" } else { "FAIL" },
            c.name,
            c.detail
        ));
    }
    text.push_str(if report.ok {
        "every invariant holds\n"
    } else {
        "some invariants do NOT hold\n"
    });
    ctx.out.print(&serde_json::to_value(&report)?, &text)?;
    if report.ok {
        return Ok(Exit::Success);
    }
    let failed: Vec<&str> = report
        .checks
        .iter()
        .filter(|c| !c.ok)
        .map(|c| c.name.as_str())
        .collect();
    let _ = writeln!(
        std::io::stderr(),
        "error: invariants violated: {}",
        failed.join(", ")
    );
    Ok(Exit::Operational)
}

/// A transfer that failed after its document was, or may have been, written: the message says
/// that it may exist and how to follow it.
#[derive(Debug)]
pub(crate) struct Unfinished(pub(crate) couch_ledger::Error);

impl fmt::Display for Unfinished {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The library's message begins with `transfer <id>:`.
        write!(f, "{}", self.0)?;
        if let Some(id) = self.0.transfer_id() {
            write!(f, "{}", unfinished_words(id))?;
        }
        Ok(())
    }
}

impl std::error::Error for Unfinished {}

pub(crate) fn unfinished_words(id: &str) -> String {
    format!(
        "; it may exist unfinished: the sweeper finishes it, and sending it again with --id {id} \
         follows it instead of making a second one"
    )
}
