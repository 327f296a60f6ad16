//! A backfill's row filter (`filter => '...'`): user SQL, checked before anything starts.
//!
//! The filter is spliced into queries as text, `... WHERE <condition> AND (\n<filter>\n)`, so
//! it is checked in exactly that text: PostgreSQL's own parser must find one plain SELECT whose
//! WHERE is the AND of our condition and one expression, the filter, and nothing else (a
//! filter such as `true) OR (true` or `true) GROUP BY (1` would change the query around it).
//! Then parse analysis must find it boolean, over existing columns, without a subquery,
//! without a volatile function and calling only code the role that runs it trusts (see
//! [`untrusted_code_of`]), and the planner (EXPLAIN, which checks every privilege the
//! query needs) must accept it, as the role that runs it: its estimate is the filtered rows.

use crate::pg::errors::raise;
use crate::pg::nodes::{is_a, list_len, list_of};
use pgrx::pg_sys::panic::CaughtError;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode::{self, *};

/// How a filter's error reads: what it is, and how a valid one looks.
const FILTER_DETAIL: &str = "A filter is one boolean SQL expression over the table's columns, evaluated as the role \
    that started the backfill, with search_path pg_catalog, pg_temp, in a security-restricted operation; \
    without subqueries and without volatile functions.";
/// The hints of the kinds of filter errors, each for its kind only.
mod hints {
    /// A name not found, or text that does not parse: how names and strings are written.
    pub const NAMES: &str = "Quote a name as in SQL (\"CreatedAt\"), and double each quote of a string inside \
        the filter's own: filter => 'created_at > now() - interval ''30 days''';";
    /// A function or operator not found: the filter's search_path.
    pub const SCHEMA: &str = "The filter is read with search_path = pg_catalog, pg_temp: qualify a function or \
        operator of another schema with its schema, e.g. filter => 'public.is_active(id)';";
    /// Not a condition.
    pub const CONDITION: &str = "A filter is a condition on a row: compare a column, e.g. filter => 'id > 1000' \
        or filter => 'archived IS NOT TRUE';";
    pub const SUBQUERY: &str = "A filter reads only the row itself: to backfill rows chosen from another table, \
        pass their keys instead, keys => (SELECT jsonb_agg(jsonb_build_object('id', id)) FROM chosen);";
    pub const VOLATILE: &str = "Use stable functions (now(), current_date), not volatile ones (random(), \
        clock_timestamp()): the filter must mean the same on every page.";
    pub const ONE_EXPRESSION: &str = "Balance the parentheses: the filter is one expression, placed in \
        parentheses inside the backfill's query.";
    pub const TEMPORARY: &str = "Create the object in a permanent schema and qualify it with that schema.";
    pub const ONE_ROW: &str = "A filter is evaluated on each row by itself: no aggregate or window function.";
    pub const NUL: &str = "Remove the NUL character from the filter.";
    /// Anything else PostgreSQL refuses: how to see the error for oneself.
    pub const OTHER: &str = "Run the filter as a page would, to see the error in full: \
        SELECT count(*) FROM <table> WHERE <filter>;";
}

/// The hint of PostgreSQL's error `code` on a filter.
fn hint_for(code: PgSqlErrorCode) -> &'static str {
    match code {
        ERRCODE_UNDEFINED_COLUMN | ERRCODE_UNDEFINED_TABLE | ERRCODE_UNDEFINED_OBJECT | ERRCODE_SYNTAX_ERROR => {
            hints::NAMES
        }
        ERRCODE_UNDEFINED_FUNCTION => hints::SCHEMA,
        ERRCODE_DATATYPE_MISMATCH | ERRCODE_INVALID_TEXT_REPRESENTATION => hints::CONDITION,
        ERRCODE_GROUPING_ERROR | ERRCODE_WINDOWING_ERROR => hints::ONE_ROW,
        _ => hints::OTHER,
    }
}

/// The settings a filter is read and evaluated with, at its check as on every page of its
/// worker, on top of the worker's (privilege::run_as: search_path, TimeZone UTC, IntervalStyle,
/// extra_float_digits): what its text means (a backslash in a string, a date's field order,
/// `x = NULL`) must not depend on the session that started the backfill. A filter read one way
/// when it was checked and another way by its worker could close the parenthesis around it.
const FILTER_SETTINGS: [(&std::ffi::CStr, &std::ffi::CStr); 9] = [
    (c"standard_conforming_strings", c"on"),
    (c"backslash_quote", c"safe_encoding"),
    (c"DateStyle", c"ISO, MDY"),
    (c"timezone_abbreviations", c"Default"),
    (c"transform_null_equals", c"off"),
    (c"array_nulls", c"on"),
    (c"bytea_output", c"hex"),
    (c"xmloption", c"content"),
    // to_tsvector(body) and to_tsquery('run') take their configuration from it.
    (c"default_text_search_config", c"pg_catalog.simple"),
];

/// The longest filter, in bytes. Its text travels in the `table_start` marker, JSON-escaped
/// (up to six bytes a byte), so it must stay far below backfill.max_message_size's default;
/// a filter near this size is already thousands of values long.
pub const MAX_FILTER_BYTES: usize = 1024 * 1024;

/// Refuses a filter longer than [`MAX_FILTER_BYTES`], before anything starts.
#[track_caller]
pub fn require_bounded(filter: &str, table: &str) {
    if filter.len() > MAX_FILTER_BYTES {
        raise(
            ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            format!("the filter of a backfill of table {table} is too long"),
            format!(
                "It takes {} bytes; a filter takes at most {MAX_FILTER_BYTES}: its text travels in the \
                 table_start message of the stream.",
                filter.len()
            ),
            Some(
                "Filter on a column's range, or backfill a table of the keys to deliver with backfill_repair(...)."
                    .into(),
            ),
        );
    }
}

/// Runs `f`, which reads or runs a filter, with [`FILTER_SETTINGS`].
pub fn with_filter_settings<R>(f: impl FnOnce() -> R) -> R {
    crate::pg::settings::with_settings(&FILTER_SETTINGS, f)
}

/// How to write a character that is not ASCII in a filter, in a database that is not UTF-8.
const NOT_ASCII_HINT: &str = r"Write other characters as Unicode escapes: filter => 'name = U&''caf\00e9''';";

/// Checks `query`, `SELECT ... FROM <table> t WHERE <condition> AND (\n<filter>\n)`, as the
/// current role (see the module's comment), with [`FILTER_SETTINGS`], and returns the planner's
/// estimate of its rows. Raises, with the table's name and PostgreSQL's SQLSTATE, if the filter
/// is not valid. The worker checks it again on every page before it runs it: a column's type, a
/// function or an overload may have changed since the backfill started.
#[track_caller]
pub fn check(query: &str, table: &str) -> f64 {
    checked(query, table, true)
}

/// Checks `query` as [`check`] does, without planning it: the worker's check at every page,
/// before the page's own query plans it.
#[track_caller]
pub fn check_again(query: &str, table: &str) {
    checked(query, table, false);
}

#[track_caller]
fn checked(query: &str, table: &str, estimate: bool) -> f64 {
    let Ok(text) = std::ffi::CString::new(query) else {
        refuse(ERRCODE_SYNTAX_ERROR, table, "it contains a NUL character", hints::NUL)
    };
    // The statements pg_backfill writes are ASCII in a database that is neither UTF-8 nor
    // SQL_ASCII (encoding.rs); a filter's text is UTF-8 here, which the parser would misread.
    if !query.is_ascii() && !crate::pg::encoding::database_takes_utf8() {
        raise(
            ERRCODE_FEATURE_NOT_SUPPORTED,
            format!("the filter of a backfill of table {table} is not valid: it is not ASCII"),
            format!(
                "In a database encoded in {}, a filter is written in ASCII.",
                crate::pg::encoding::database_encoding_name()
            ),
            Some(NOT_ASCII_HINT.into()),
        );
    }
    with_filter_settings(|| analyzed(&text, query, table, estimate))
}

#[track_caller]
fn analyzed(text: &std::ffi::CStr, query: &str, table: &str, estimate: bool) -> f64 {
    // Parse errors (42601), unknown columns (42703), a type that is not boolean (42804),
    // missing privileges (42501, at planning) are PostgreSQL's own, raised again with their
    // SQLSTATE.
    // (The worker has no temporary schema: a name in one fails there anyway.)
    let checked = PgTryBuilder::new(|| match refusal_of(text, estimate) {
        None if estimate => Ok(crate::pg::spi::planned_rows(query)),
        None => Ok(None),
        Some(refusal) => Err(refusal),
    })
    .catch_others(|caught| {
        let report = match caught {
            CaughtError::PostgresError(r) | CaughtError::ErrorReport(r) => r,
            CaughtError::RustPanic { ereport, .. } => ereport,
        };
        Err(Refusal::Error(report.sql_error_code(), report.message().to_string()))
    })
    .execute();
    match checked {
        Ok(rows) => rows.unwrap_or(0.0),
        Err(Refusal::Error(code, message)) => refuse(code, table, &message, hint_for(code)),
        Err(Refusal::NotOneExpression) => refuse(
            ERRCODE_SYNTAX_ERROR,
            table,
            "it is not one expression (it reaches outside the parentheses around it)",
            hints::ONE_EXPRESSION,
        ),
        Err(Refusal::NotBoolean(type_name)) => refuse(
            ERRCODE_DATATYPE_MISMATCH,
            table,
            &format!("it is an expression of type {type_name}, not boolean"),
            hints::CONDITION,
        ),
        Err(Refusal::HasSubquery) => {
            refuse(ERRCODE_FEATURE_NOT_SUPPORTED, table, "it contains a subquery", hints::SUBQUERY)
        }
        Err(Refusal::Volatile) => {
            refuse(ERRCODE_FEATURE_NOT_SUPPORTED, table, "it calls a volatile function", hints::VOLATILE)
        }
        Err(Refusal::Untrusted { code, owner }) => raise(
            ERRCODE_INSUFFICIENT_PRIVILEGE,
            format!(
                "the filter of a backfill of table {table} is not valid: it runs {code}, owned by role \"{owner}\", as \
                 the role that started the backfill"
            ),
            "A filter runs as the role that started the backfill, so it may run only code that role or a superuser \
             owns, or code in a language only superusers write (C, internal): the functions it calls, those of its \
             operators and casts (implicit ones too: a column's type may be cast to compare it), the input and \
             output functions of the types it converts, and the checks of the domains it casts to. Whatever their \
             volatility says.",
            Some(format!(
                "Compare the column through a type and functions of pg_catalog, or ask role \"{owner}\" or a superuser \
                 to start the backfill."
            )),
        ),
        Err(Refusal::Temporary) => refuse(
            ERRCODE_FEATURE_NOT_SUPPORTED,
            table,
            "it names a temporary object (pg_temp), which the backfill's worker cannot see",
            hints::TEMPORARY,
        ),
    }
}

#[track_caller]
fn refuse(code: PgSqlErrorCode, table: &str, why: &str, hint: &str) -> ! {
    raise(
        code,
        format!("the filter of a backfill of table {table} is not valid: {why}"),
        FILTER_DETAIL,
        Some(hint.replace("<table>", table)),
    )
}

/// Why a filter is refused.
enum Refusal {
    /// PostgreSQL's error: its SQLSTATE and message.
    Error(PgSqlErrorCode, String),
    NotOneExpression,
    /// It is an expression of this type, which is not boolean (and not assignable to it).
    NotBoolean(String),
    HasSubquery,
    Volatile,
    /// It runs code (`code`: "function f(integer)", "domain d") owned by `owner`, whom the role
    /// that runs it does not trust.
    Untrusted {
        code: String,
        owner: String,
    },
    /// It names an object of the caller's temporary schema, which its worker does not have.
    Temporary,
}

/// Why the parser and parse analysis refuse `query`'s filter, if they do (PostgreSQL's own
/// errors are raised); with `in_caller`, also for naming the caller's temporary objects.
fn refusal_of(query: &std::ffi::CStr, in_caller: bool) -> Option<Refusal> {
    // SAFETY: the parser's and the analyzer's nodes live in the current memory context, which
    // outlives this function; every pointer read is checked for NULL and its node tag first.
    unsafe {
        let statements = pg_sys::raw_parser(query.as_ptr(), pg_sys::RawParseMode::RAW_PARSE_DEFAULT);
        let [raw] = list_of::<pg_sys::RawStmt>(statements)[..] else { return Some(Refusal::NotOneExpression) };
        let select = (*raw).stmt as *mut pg_sys::SelectStmt;
        if !is_a(select as *mut pg_sys::Node, pg_sys::NodeTag::T_SelectStmt) || !is_one_filtered_select(&*select) {
            return Some(Refusal::NotOneExpression);
        }
        if let Some(type_name) = not_boolean(raw, query) {
            return Some(Refusal::NotBoolean(type_name));
        }
        let analyzed =
            pg_sys::parse_analyze_fixedparams(raw, query.as_ptr(), std::ptr::null(), 0, std::ptr::null_mut());
        if (*analyzed).hasSubLinks {
            return Some(Refusal::HasSubquery);
        }
        let quals = (*(*analyzed).jointree).quals;
        if pg_sys::contain_volatile_functions(quals) {
            return Some(Refusal::Volatile);
        }
        if in_caller && names_temporary_objects(quals) {
            return Some(Refusal::Temporary);
        }
        untrusted_code_of(quals).map(|(code, owner)| Refusal::Untrusted { code, owner })
    }
}

/// The type of the filter of `raw` (a statement [`is_one_filtered_select`] accepted), if it is
/// not one the WHERE clause takes as a condition. Analyzed alone, as the only column of a copy
/// of the statement without its WHERE, so that the error names the filter's type rather than
/// the AND that pg_backfill puts it in ("argument of AND must be type boolean"). A literal is
/// left to the statement itself: there, its text is read as a boolean.
///
/// # Safety
/// `raw` is the raw statement of `query`.
unsafe fn not_boolean(raw: *mut pg_sys::RawStmt, query: &std::ffi::CStr) -> Option<String> {
    let probe = pg_sys::copyObjectImpl(raw as *const std::ffi::c_void) as *mut pg_sys::RawStmt;
    let select = (*probe).stmt as *mut pg_sys::SelectStmt;
    let condition = (*select).whereClause as *mut pg_sys::BoolExpr;
    let filter = *list_of::<pg_sys::Node>((*condition).args).get(1)?;
    if is_a(filter, pg_sys::NodeTag::T_A_Const) {
        return None;
    }
    let column = pg_sys::palloc0(std::mem::size_of::<pg_sys::ResTarget>()) as *mut pg_sys::ResTarget;
    (*column).type_ = pg_sys::NodeTag::T_ResTarget;
    (*column).val = filter;
    (*column).location = -1;
    (*select).targetList = pg_sys::lappend(std::ptr::null_mut(), column.cast());
    (*select).whereClause = std::ptr::null_mut();
    let analyzed = pg_sys::parse_analyze_fixedparams(probe, query.as_ptr(), std::ptr::null(), 0, std::ptr::null_mut());
    let entry = *list_of::<pg_sys::TargetEntry>((*analyzed).targetList).first()?;
    let type_oid = pg_sys::exprType((*entry).expr.cast());
    let takes = type_oid == pg_sys::BOOLOID
        || pg_sys::can_coerce_type(1, &type_oid, &pg_sys::BOOLOID, pg_sys::CoercionContext::COERCION_ASSIGNMENT);
    if takes {
        return None;
    }
    let name = pg_sys::format_type_be(type_oid);
    Some(std::ffi::CStr::from_ptr(name).to_string_lossy().into_owned())
}

/// What an analyzed expression runs when evaluated: the functions it calls (its operators' and
/// casts' included, and the input and output functions of the types it converts through
/// text), and the domains whose checks it runs.
#[derive(Default)]
struct Code {
    functions: Vec<pg_sys::Oid>,
    domains: Vec<pg_sys::Oid>,
}

/// The first code the analyzed filter `quals` runs that the current role does not trust, as
/// ("function f(integer)", its owner's name): code is trusted when the current role or a
/// superuser owns it, or it is written in a language only superusers may use (C, internal).
/// A function's volatility label proves nothing of what it does, so ownership decides. A
/// domain's checks run the functions they call: those are checked too, through every domain
/// that a domain is over.
///
/// # Safety
/// `quals` is an analyzed expression.
unsafe fn untrusted_code_of(quals: *mut pg_sys::Node) -> Option<(String, String)> {
    let mut code = Code::default();
    collect_code(quals, &mut code);
    let mut walked_domains: Vec<pg_sys::Oid> = Vec::new();
    loop {
        let new_domains: Vec<pg_sys::Oid> =
            code.domains.iter().copied().filter(|d| !walked_domains.contains(d)).collect();
        if new_domains.is_empty() {
            break;
        }
        walked_domains.extend(&new_domains);
        // The checks of these domains and of the domains they are over, and those domains.
        let (checks, chain) = Spi::connect(|client| {
            let row = client
                .select(
                    "WITH RECURSIVE chain(oid) AS (
                         SELECT t.oid FROM pg_catalog.pg_type t WHERE t.oid OPERATOR(pg_catalog.=) ANY ($1)
                         UNION SELECT t.typbasetype FROM pg_catalog.pg_type t
                                 JOIN chain ON chain.oid OPERATOR(pg_catalog.=) t.oid
                          WHERE t.typtype OPERATOR(pg_catalog.=) 'd')
                     SELECT (SELECT pg_catalog.array_agg(c.conbin::pg_catalog.text)
                               FROM pg_catalog.pg_constraint c JOIN chain ON c.contypid OPERATOR(pg_catalog.=) chain.oid
                              WHERE c.contype OPERATOR(pg_catalog.=) 'c'),
                            (SELECT pg_catalog.array_agg(t.oid)
                               FROM chain JOIN pg_catalog.pg_type t ON t.oid OPERATOR(pg_catalog.=) chain.oid
                              WHERE t.typtype OPERATOR(pg_catalog.=) 'd')",
                    Some(1),
                    &[new_domains.into()],
                )?
                .first();
            Ok::<_, pgrx::spi::Error>((row.get::<Vec<String>>(1)?, row.get::<Vec<pg_sys::Oid>>(2)?))
        })
        .unwrap_or_default();
        code.domains.extend(chain.unwrap_or_default());
        let checks = checks.unwrap_or_default();
        for check in checks {
            let Ok(text) = std::ffi::CString::new(check) else { continue };
            collect_code(pg_sys::stringToNode(text.as_ptr()).cast(), &mut code);
        }
    }
    let (functions, domains) = (code.functions, code.domains);
    // SAFETY: the current user's id.
    let role = unsafe { pg_sys::GetUserId() };
    let untrusted = Spi::connect(|client| {
        let row = client
            .select(
                "SELECT pg_catalog.format('function %s', p.oid::pg_catalog.regprocedure), r.rolname::pg_catalog.text
                   FROM pg_catalog.pg_proc p
                   JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) p.proowner
                   JOIN pg_catalog.pg_language l ON l.oid OPERATOR(pg_catalog.=) p.prolang
                  WHERE p.oid OPERATOR(pg_catalog.=) ANY ($1)
                    AND p.proowner OPERATOR(pg_catalog.<>) $3 AND NOT r.rolsuper AND l.lanpltrusted
                 UNION ALL
                 SELECT pg_catalog.format('domain %s', t.oid::pg_catalog.regtype), r.rolname::pg_catalog.text
                   FROM pg_catalog.pg_type t
                   JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) t.typowner
                  WHERE t.oid OPERATOR(pg_catalog.=) ANY ($2)
                    AND t.typowner OPERATOR(pg_catalog.<>) $3 AND NOT r.rolsuper
                 LIMIT 1",
                Some(1),
                &[functions.into(), domains.into(), role.into()],
            )?
            .first();
        Ok::<_, pgrx::spi::Error>(if row.is_empty() {
            None
        } else {
            Some((row.get::<String>(1)?.unwrap_or_default(), row.get::<String>(2)?.unwrap_or_default()))
        })
    });
    untrusted.ok().flatten()
}

/// Adds what `node`, an analyzed expression (or NULL), runs to `code`.
///
/// # Safety
/// `node` is NULL or an analyzed expression.
unsafe fn collect_code(node: *mut pg_sys::Node, code: &mut Code) {
    code_walker(node, (code as *mut Code).cast());
}

#[pg_guard]
unsafe extern "C-unwind" fn code_walker(node: *mut pg_sys::Node, context: *mut std::ffi::c_void) -> bool {
    if node.is_null() {
        return false;
    }
    // (Functions of operators, casts, type conversions through text, comparisons of rows.)
    pg_sys::check_functions_in_node(node, Some(note_function), context);
    if is_a(node, pg_sys::NodeTag::T_CoerceToDomain) {
        let domain = (*(node as *mut pg_sys::CoerceToDomain)).resulttype;
        (*(context as *mut Code)).domains.push(domain);
    }
    pg_sys::expression_tree_walker(node, Some(code_walker), context)
}

#[pg_guard]
unsafe extern "C-unwind" fn note_function(function: pg_sys::Oid, context: *mut std::ffi::c_void) -> bool {
    (*(context as *mut Code)).functions.push(function);
    false
}

/// Whether the analyzed filter `quals` names a function, operator, type or collation of this
/// session's temporary schema: found by the OIDs its node text gives them (`:funcid 16384`...,
/// and every field naming a collation: `:inputcollid`, `:collOid`...), the fields that name
/// those objects.
///
/// # Safety
/// `quals` is an analyzed expression.
unsafe fn names_temporary_objects(quals: *mut pg_sys::Node) -> bool {
    if quals.is_null() {
        return false;
    }
    let text = std::ffi::CStr::from_ptr(pg_sys::nodeToString(quals.cast())).to_string_lossy().into_owned();
    let text = text.as_str();
    const FIELDS: [&str; 6] = ["funcid", "opno", "opfuncid", "resulttype", "consttype", "vartype"];
    let names_an_object = |field: &str| FIELDS.contains(&field) || field.to_ascii_lowercase().contains("coll");
    let oids: Vec<pg_sys::Oid> = text
        .split(':')
        .skip(1)
        .filter_map(|pair| {
            let (field, rest) = pair.split_once(' ')?;
            names_an_object(field).then(|| rest.split(|c: char| !c.is_ascii_digit()).next()?.parse::<u32>().ok())?
        })
        .collect::<std::collections::BTreeSet<u32>>()
        .into_iter()
        .map(pg_sys::Oid::from)
        .collect();
    crate::pg::spi::select_one::<bool>(
        "SELECT pg_catalog.pg_my_temp_schema() OPERATOR(pg_catalog.<>) 0
            AND (EXISTS (SELECT FROM pg_catalog.pg_proc p WHERE p.oid OPERATOR(pg_catalog.=) ANY ($1)
                            AND p.pronamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema())
                 OR EXISTS (SELECT FROM pg_catalog.pg_operator o WHERE o.oid OPERATOR(pg_catalog.=) ANY ($1)
                            AND o.oprnamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema())
                 OR EXISTS (SELECT FROM pg_catalog.pg_type t WHERE t.oid OPERATOR(pg_catalog.=) ANY ($1)
                            AND t.typnamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema())
                 OR EXISTS (SELECT FROM pg_catalog.pg_collation c WHERE c.oid OPERATOR(pg_catalog.=) ANY ($1)
                            AND c.collnamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema()))",
        &[oids.into()],
    )
    .ok()
    .flatten()
    .unwrap_or(false)
}

/// Whether the statement is `SELECT <one target> FROM <one table> WHERE <ours> AND (<filter>)`
/// and nothing more: its WHERE an AND of exactly two operands (a filter that closes our
/// parenthesis and opens another, `x) AND (y`, makes three; `x) OR (y`, an OR).
///
/// # Safety
/// `select` is a raw parse tree.
unsafe fn is_one_filtered_select(select: &pg_sys::SelectStmt) -> bool {
    let only_where = select.op == pg_sys::SetOperation::SETOP_NONE
        && list_len(select.targetList) <= 1
        && list_len(select.fromClause) == 1
        && [select.distinctClause, select.groupClause, select.windowClause, select.valuesLists, select.sortClause]
            .iter()
            .all(|list| list.is_null())
        && select.lockingClause.is_null()
        && select.intoClause.is_null()
        && select.havingClause.is_null()
        && select.limitOffset.is_null()
        && select.limitCount.is_null()
        && select.withClause.is_null();
    let condition = select.whereClause as *mut pg_sys::BoolExpr;
    only_where
        && is_a(condition as *mut pg_sys::Node, pg_sys::NodeTag::T_BoolExpr)
        && (*condition).boolop == pg_sys::BoolExprType::AND_EXPR
        && list_len((*condition).args) == 2
}
