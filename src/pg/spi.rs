//! SPI as pg_backfill uses it: reads that do not mark the transaction as one that writes, and
//! the one cache of prepared statements.
//!
//! pgrx's `Spi::get_one` and `update` assign the transaction an id: a read through them makes
//! a `SELECT * FROM backfill_status` write a commit record, and fails on a standby ("cannot
//! assign TransactionIds during recovery"). Reads go through here instead.

use crate::pg::errors::OrInternal;
use pgrx::datum::{DatumWithOid, FromDatum, IntoDatum};
use pgrx::prelude::*;
use pgrx::spi::{OwnedPreparedStatement, SpiResult, SpiTupleTable};
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_int, CString};
use std::rc::Rc;

// Statements kept prepared for the process's lifetime, by their SQL text: the worker runs the
// same few every page (its state updates, the page's bound, the page's rows), and parsing and
// planning them each time would cost about as much as running them. A table whose columns
// change gets new texts, so new plans; PostgreSQL's plan cache revalidates the others.
//
// A statement is shared out of the map while it runs (Rc): a statement may call a function that
// runs another kept statement (backfill.message_key's view calls message_key_bytes()), and the
// map must not be borrowed across the call.
thread_local! {
    static PREPARED: RefCell<HashMap<String, Rc<OwnedPreparedStatement>>> = RefCell::new(HashMap::new());
    static KEPT_PLANS: RefCell<HashMap<String, KeptPlan>> = RefCell::new(HashMap::new());
}

/// A plan for `delivery.rs`, whose rows go to a DestReceiver of its own.
#[derive(Clone, Copy)]
struct KeptPlan(pg_sys::SPIPlanPtr);

/// Runs `sql`, prepared once per process (the argument types come from the arguments). A
/// statement that `writes` marks the transaction as writing; a read does not.
pub fn run_prepared<R>(
    sql: &str,
    writes: bool,
    args: &[DatumWithOid],
    read: impl FnOnce(SpiTupleTable) -> SpiResult<R>,
) -> SpiResult<R> {
    Spi::connect_mut(|client| {
        let kept = PREPARED.with(|prepared| prepared.borrow().get(sql).cloned());
        let statement = match kept {
            Some(statement) => statement,
            None => {
                let types: Vec<PgOid> = args.iter().map(|a| PgOid::from(a.oid())).collect();
                let statement = Rc::new(
                    if writes { client.prepare_mut(sql, &types)? } else { client.prepare(sql, &types)? }.keep(),
                );
                PREPARED.with(|prepared| prepared.borrow_mut().insert(sql.to_string(), statement.clone()));
                statement
            }
        };
        let statement = &*statement;
        read(if writes { client.update(statement, None, args)? } else { client.select(statement, None, args)? })
    })
}

/// The first column of the first row of `sql`, prepared once per process as [`run_prepared`]
/// keeps it: for a read the worker repeats every page or every table, whose parsing and
/// planning would otherwise cost more than running it.
pub fn select_one_prepared<T: FromDatum + IntoDatum>(sql: &str, args: &[DatumWithOid]) -> SpiResult<Option<T>> {
    run_prepared(sql, false, args, |rows| if rows.is_empty() { Ok(None) } else { rows.first().get::<T>(1) })
}

/// `sql`'s plan, prepared once per process with parameters of the types of `args`, for
/// `SPI_execute_plan_extended` with a receiver of the caller's.
pub fn kept_plan(sql: &str, args: &[DatumWithOid]) -> pg_sys::SPIPlanPtr {
    if let Some(plan) = KEPT_PLANS.with(|plans| plans.borrow().get(sql).copied()) {
        return plan.0;
    }
    let text = CString::new(sql).expect("generated SQL has no NUL byte");
    let mut types: Vec<pg_sys::Oid> = args.iter().map(|a| a.oid()).collect();
    // SAFETY: SPI is connected around the call; the types array has one entry per parameter;
    // the plan is kept (moved out of SPI's memory) before SPI_finish.
    let plan = unsafe {
        pg_sys::SPI_connect();
        let plan = pg_sys::SPI_prepare(text.as_ptr(), types.len() as c_int, types.as_mut_ptr());
        if plan.is_null() {
            let code = std::ptr::addr_of!(pg_sys::SPI_result).read();
            crate::pg::errors::spi_failed("prepare a page query", code);
        }
        pg_sys::SPI_keepplan(plan);
        pg_sys::SPI_finish();
        plan
    };
    KEPT_PLANS.with(|plans| plans.borrow_mut().insert(sql.to_string(), KeptPlan(plan)));
    plan
}

/// Frees the plan of `sql`, if it has one: a scan that ends, or whose table's columns changed,
/// never runs its queries again. In a transaction.
pub fn forget(sql: &str) {
    PREPARED.with(|prepared| prepared.borrow_mut().remove(sql));
    if let Some(plan) = KEPT_PLANS.with(|plans| plans.borrow_mut().remove(sql)) {
        // SAFETY: a plan kept by kept_plan, freed once: it has just left the map.
        unsafe { pg_sys::SPI_freeplan(plan.0) };
    }
}

/// The first column of the first row of a query, if it returns a row.
pub fn select_one<T: FromDatum + IntoDatum>(query: &str, args: &[DatumWithOid]) -> SpiResult<Option<T>> {
    Spi::connect(|client| {
        let rows = client.select(query, Some(1), args)?;
        if rows.is_empty() {
            Ok(None)
        } else {
            rows.first().get::<T>(1)
        }
    })
}

/// The first column (a bigint) of the first row of `sql`, read on the latest committed state
/// whatever the transaction's isolation, as PostgreSQL's foreign-key checks read in REPEATABLE
/// READ: a check under a lock that others hold until they commit must see what they committed,
/// where a REPEATABLE READ or SERIALIZABLE transaction's own snapshot is from its first statement.
pub fn select_id_on_latest_snapshot(sql: &str, args: &[DatumWithOid]) -> Option<i64> {
    let text = CString::new(sql).expect("pg_backfill's SQL has no NUL byte");
    let mut types: Vec<pg_sys::Oid> = args.iter().map(|a| a.oid()).collect();
    let mut values: Vec<pg_sys::Datum> =
        args.iter().map(|a| a.datum().map(|d| d.sans_lifetime()).unwrap_or(pg_sys::Datum::from(0))).collect();
    let nulls: Vec<std::ffi::c_char> =
        args.iter().map(|a| if a.datum().is_some() { b' ' } else { b'n' } as std::ffi::c_char).collect();
    // SAFETY: SPI is connected around the statement; the types, values and nulls arrays have one
    // entry per parameter and outlive the call; the bigint is copied out (by value) before
    // SPI_finish frees the result.
    unsafe {
        pg_sys::SPI_connect();
        let plan = pg_sys::SPI_prepare(text.as_ptr(), types.len() as c_int, types.as_mut_ptr());
        if plan.is_null() {
            let code = std::ptr::addr_of!(pg_sys::SPI_result).read();
            crate::pg::errors::spi_failed("prepare a check of the running backfills", code);
        }
        let code = pg_sys::SPI_execute_snapshot(
            plan,
            values.as_mut_ptr(),
            nulls.as_ptr(),
            pg_sys::GetLatestSnapshot(),
            std::ptr::null_mut(),
            false,
            false,
            1,
        );
        if code != pg_sys::SPI_OK_SELECT as i32 {
            crate::pg::errors::spi_failed("check the running backfills", code);
        }
        let id = if pg_sys::SPI_processed > 0 {
            let table = *pg_sys::SPI_tuptable;
            let mut is_null = false;
            let datum = pg_sys::SPI_getbinval(*table.vals, table.tupdesc, 1, &mut is_null);
            i64::from_datum(datum, is_null)
        } else {
            None
        };
        pg_sys::SPI_finish();
        id
    }
}

/// The planner's estimate of the rows a query returns (`EXPLAIN`), without assigning the
/// transaction an id as pgrx's `Spi::explain` does, so that it works on a standby too. The plan
/// is read as text in the database's encoding (it names the table) and converted to UTF-8.
pub fn planned_rows(query: &str) -> Option<f64> {
    let explain = std::ffi::CString::new(format!("EXPLAIN (FORMAT JSON) {query}")).ok()?;
    // SAFETY: SPI is connected around the statement; the plan's text is copied out of SPI's
    // memory before SPI_finish frees it. EXPLAIN without ANALYZE runs nothing and writes nothing
    // (it is refused in read-only SPI only because it is a utility statement).
    let plan = unsafe {
        pg_sys::SPI_connect();
        let text = if pg_sys::SPI_execute(explain.as_ptr(), false, 1) == pg_sys::SPI_OK_UTILITY as i32
            && pg_sys::SPI_processed == 1
        {
            let table = *pg_sys::SPI_tuptable;
            let value = pg_sys::SPI_getvalue(*table.vals, table.tupdesc, 1);
            (!value.is_null()).then(|| std::ffi::CStr::from_ptr(value).to_bytes().to_vec())
        } else {
            None
        };
        pg_sys::SPI_finish();
        text
    }?;
    let plan: serde_json::Value = serde_json::from_slice(&crate::pg::encoding::to_utf8(&plan)?).ok()?;
    plan[0]["Plan"]["Plan Rows"].as_f64()
}

/// The names of a table's columns, in attribute order (dropped ones left out), in UTF-8.
pub fn column_names(relid: pg_sys::Oid) -> Vec<String> {
    select_one::<Vec<crate::pg::encoding::Text>>(
        "SELECT ARRAY(SELECT a.attname::pg_catalog.text FROM pg_catalog.pg_attribute a
                       WHERE a.attrelid OPERATOR(pg_catalog.=) $1
                         AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped
                       ORDER BY a.attnum)",
        &[relid.into()],
    )
    .or_internal("read the table's columns")
    .map(crate::pg::encoding::strings)
    .unwrap_or_default()
}

/// The table's name, schema-qualified and quoted.
pub fn qualified_name(relid: pg_sys::Oid) -> String {
    let sql = "SELECT n.nspname::pg_catalog.text, c.relname::pg_catalog.text FROM pg_catalog.pg_class c
                 JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
                WHERE c.oid OPERATOR(pg_catalog.=) $1";
    let names = Spi::connect(|client| {
        let rows = client.select(sql, Some(1), &[relid.into()])?;
        if rows.is_empty() {
            return Ok(None);
        }
        let row = rows.first();
        Ok::<_, pgrx::spi::Error>(
            row.get::<crate::pg::encoding::Text>(1)?.zip(row.get::<crate::pg::encoding::Text>(2)?),
        )
    })
    .or_internal("read the table's name");
    let Some((schema, name)) = names else {
        crate::pg::errors::raise(
            pgrx::PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE,
            format!("relation with OID {} does not exist", relid.to_u32()),
            "It was dropped.",
            Some("Name the table as it is now, e.g. 'public.orders'.".into()),
        )
    };
    crate::pg::encoding::quote_qualified(&schema.0, &name.0)
}

/// `read` on a snapshot taken now: a loop in one statement (backfill_wait()) then sees what
/// other transactions committed since it began. (A read in a transaction that writes nothing
/// runs on the statement's active snapshot.)
pub fn with_fresh_snapshot<R>(read: impl FnOnce() -> R) -> R {
    // SAFETY: pushed here and popped below, around `read`, whatever it returns (an error inside
    // aborts the transaction, which pops it).
    unsafe { pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot()) };
    let result = read();
    // SAFETY: the snapshot pushed above.
    unsafe { pg_sys::PopActiveSnapshot() };
    result
}

/// The schema extension `name` is installed in, quoted; None where it is not installed.
pub fn schema_of_extension(name: &str) -> Option<String> {
    select_one::<crate::pg::encoding::Text>(
        "SELECT pg_catalog.quote_ident(n.nspname::pg_catalog.text) FROM pg_catalog.pg_extension e
           JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace
          WHERE e.extname OPERATOR(pg_catalog.=) $1",
        &[name.into()],
    )
    .or_internal("read an extension's schema")
    .map(|schema| schema.0)
}

/// The schema pg_backfill is installed in, quoted: where its views and public functions are.
pub fn extension_schema() -> String {
    schema_of_extension("pg_backfill").unwrap_or_else(|| "public".into())
}
