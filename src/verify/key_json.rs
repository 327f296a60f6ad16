//! Keys as JSON objects (`{"id": 7}`, `{"region": "eu", "seq": 1}`), as checksums report their
//! bounds, comparisons their keys, and callers give bounds and keys: building them in SQL,
//! reading them back as the key's types, and checking lists of them.

use crate::pg::encoding::{quote_ident, Text};
use crate::pg::errors::{raise, OrInternal};
use pgrx::prelude::*;
use pgrx::JsonB;
use pgrx::PgSqlErrorCode::*;

/// Each key column of a bound, as JSON: `t.col` or `b->>'col'` cast to its type.
pub fn key_expression(key: &[(String, String)], column: impl Fn(&str, &str) -> String) -> String {
    let parts: Vec<String> = key.iter().map(|(name, type_name)| column(name, type_name)).collect();
    if parts.len() == 1 {
        parts[0].clone()
    } else {
        format!("ROW({})", parts.join(", "))
    }
}

/// A key column's value in a key object (`json`, a jsonb expression), as the column's type:
/// `(json ->> 'col')::type`, or for a composite or array key, whose JSON is an object or an
/// array, read as jsonb_to_record() reads a column of that type from it.
pub fn key_from_json(json: &str, column: &str, type_name: &str) -> String {
    let structured = crate::pg::spi::select_one::<bool>(
        "SELECT b.typtype OPERATOR(pg_catalog.=) 'c' OR b.typcategory OPERATOR(pg_catalog.=) 'A'
           FROM pg_catalog.pg_type t
           JOIN pg_catalog.pg_type b ON b.oid OPERATOR(pg_catalog.=) CASE WHEN t.typbasetype OPERATOR(pg_catalog.<>) 0
                                                                      THEN t.typbasetype ELSE t.oid END
          WHERE t.oid OPERATOR(pg_catalog.=) pg_catalog.to_regtype($1)",
        &[Text(type_name.to_string()).into()],
    )
    .or_internal("read the key's type");
    let field = crate::pg::encoding::quote_literal(column);
    if structured == Some(true) {
        format!(
            "(SELECT r.v FROM pg_catalog.jsonb_to_record(pg_catalog.jsonb_build_object('v', {json} OPERATOR(pg_catalog.->) {field})) AS r(v {type_name}))"
        )
    } else {
        format!("({json} OPERATOR(pg_catalog.->>) {field})::{type_name}")
    }
}

pub fn json_object_of(key: &[(String, String)], prefix: &str) -> String {
    let fields: Vec<String> = key
        .iter()
        .map(|(name, _)| format!("{}, {prefix}{}", crate::pg::encoding::quote_literal(name), quote_ident(name)))
        .collect();
    format!("pg_catalog.jsonb_build_object({})", fields.join(", "))
}

/// Keys given by the caller (`argument`: bounds, keys): an array of objects with a non-null
/// value for every key column.
pub fn checked_keys(
    keys: serde_json::Value,
    key: &[(String, String)],
    argument: &str,
    (most, why_so_few, instead): (usize, &str, &str),
) -> Vec<serde_json::Value> {
    let serde_json::Value::Array(keys) = keys else {
        raise(
            ERRCODE_INVALID_PARAMETER_VALUE,
            format!("{argument} must be a JSON array"),
            format!("{argument} lists keys, as key objects."),
            Some(format!(r#"{argument} => '[{{"id": 1000}}, {{"id": 2000}}]'"#)),
        );
    };
    if keys.len() > most {
        raise(
            ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            format!("{argument} lists {} keys, more than {most}", keys.len()),
            why_so_few,
            Some(instead.into()),
        );
    }
    for value in &keys {
        let complete =
            value.as_object().is_some_and(|o| key.iter().all(|(name, _)| o.get(name).is_some_and(|v| !v.is_null())));
        if !complete {
            raise(
                ERRCODE_INVALID_PARAMETER_VALUE,
                format!("{argument} element {value} does not name every key column"),
                format!(
                    "Each element is an object with a non-null value for every key column: {}.",
                    key.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(", ")
                ),
                Some(format!(
                    "Give every key column in each element, e.g. {}.",
                    serde_json::Value::Object(key.iter().map(|(n, _)| (n.clone(), serde_json::json!(1))).collect())
                )),
            );
        }
    }
    keys
}

/// Bounds given by the caller are strictly ascending in the key's order (as the key's index
/// orders it: each column with its collation), and each is a value of the key's types (cast
/// now, even when the table is empty): else ranges would overlap or miss rows.
pub fn require_ascending(relid: pg_sys::Oid, key: &[(String, String)], bounds: &[serde_json::Value]) {
    let collations: Vec<Option<String>> = key
        .iter()
        .map(|(column, _)| {
            crate::pg::spi::select_one::<Text>(
                "SELECT pg_catalog.quote_ident(n.nspname) OPERATOR(pg_catalog.||) '.' OPERATOR(pg_catalog.||)
                        pg_catalog.quote_ident(c.collname)
                   FROM pg_catalog.pg_attribute a
                   JOIN pg_catalog.pg_collation c ON c.oid OPERATOR(pg_catalog.=) a.attcollation
                   JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.collnamespace
                  WHERE a.attrelid OPERATOR(pg_catalog.=) $1 AND a.attname OPERATOR(pg_catalog.=) $2",
                &[relid.into(), Text(column.clone()).into()],
            )
            .or_internal("read the key's collations")
            .map(|t| t.0)
        })
        .collect();
    let each = key_expression(key, |column, type_name| {
        let collation = key.iter().position(|(c, _)| c == column).and_then(|i| collations[i].clone());
        let cast = key_from_json("e.b", column, type_name);
        match collation {
            Some(collation) => format!("{cast} COLLATE {collation}"),
            None => cast,
        }
    });
    let sql = format!(
        "SELECT p.o::pg_catalog.int4 FROM (
             SELECT e.o, {each} AS k, pg_catalog.lag({each}) OVER (ORDER BY e.o) AS previous
               FROM pg_catalog.jsonb_array_elements($1) WITH ORDINALITY AS e(b, o)) p
          WHERE NOT (p.previous OPERATOR(pg_catalog.<) p.k) ORDER BY p.o LIMIT 1"
    );
    let first_out_of_order =
        crate::pg::spi::select_one::<i32>(&sql, &[JsonB(serde_json::Value::Array(bounds.to_vec())).into()])
            .or_internal("check the bounds' order");
    if let Some(position) = first_out_of_order {
        let at = position as usize - 1;
        raise(
            ERRCODE_INVALID_PARAMETER_VALUE,
            format!("bounds are not in ascending key order at element {position}"),
            format!(
                "Bound {} is not above the bound before it, {}: ranges lie between ascending bounds, each key in one.",
                bounds[at],
                bounds[at - 1]
            ),
            Some("List the bounds in ascending key order, each once.".into()),
        );
    }
}
