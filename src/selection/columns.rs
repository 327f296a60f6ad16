//! A backfill's column list (`columns => ...`): the columns its reads carry.
//!
//! The key is always among them: a read without its key could not be ordered against the
//! key's changes, nor applied. When the backfill names its pipeline's publication and that
//! publication does not publish every column (a column list for the table, or generated columns
//! pgoutput does not send: publication.rs), the publication's columns are the default, and
//! a list with a column it leaves out is refused: a backfill never sends what the publication
//! withholds from the same consumer. The columns go out in the table's order, as a
//! publication's column list does, whatever order they are named in.

use crate::model::table::Table;
use crate::pg::encoding::{quote_ident, Text};
use crate::pg::errors::{raise, OrInternal};
use crate::selection::publication::Published;
use pgrx::PgSqlErrorCode::*;
use std::collections::HashSet;

const LIST_DETAIL: &str = "columns => names the columns each read carries, as a text array; the key's columns \
    must be among them. NULL: every column (or the publication's column list).";

/// The column list given to backfill_start() or backfill_estimate(), checked on its own: no
/// NULL, no name twice, not empty. NULL: none given.
pub fn given(columns: Option<Vec<Option<Text>>>) -> Option<Vec<String>> {
    let columns = columns?;
    if columns.is_empty() {
        raise(
            ERRCODE_INVALID_PARAMETER_VALUE,
            "the column list is empty",
            LIST_DETAIL,
            Some("List at least the key's columns, or pass NULL (the default) for every column.".into()),
        );
    }
    let mut seen = HashSet::with_capacity(columns.len());
    let mut list = Vec::with_capacity(columns.len());
    for column in columns {
        let Some(Text(name)) = column else {
            raise(
                ERRCODE_NULL_VALUE_NOT_ALLOWED,
                "the column list contains NULL",
                LIST_DETAIL,
                Some("Remove the NULL: name every column, e.g. columns => ARRAY['id', 'amount'].".into()),
            );
        };
        if !seen.insert(name.clone()) {
            raise(
                ERRCODE_DUPLICATE_COLUMN,
                format!("column {} is listed twice", quote_ident(&name)),
                LIST_DETAIL,
                Some(format!("Remove the second {} from the list.", quote_ident(&name))),
            );
        }
        list.push(name);
    }
    Some(list)
}

/// The column list of `table` in a backfill given `given` (see [`given`]) for its pipeline's
/// `publication` (its name, and what it publishes of the table): `given`, else the
/// publication's column list for the table, else none.
/// Raises, naming the table and the column, if a listed column is not the table's (42703),
/// if the list leaves out a key column (22023), or if the publication withholds a listed
/// column (42501).
pub fn column_list(
    table: &Table,
    given: Option<&[String]>,
    publication: Option<(&str, &Published)>,
) -> Option<Vec<String>> {
    let published = publication.and_then(|(_, published)| published.columns.clone());
    let publication = publication.map(|(name, _)| name);
    let name = table.qualified_name();
    if let Some(given) = given {
        if let Some(missing) = given.iter().find(|c| !table.columns.iter().any(|t| &&t.name == c)) {
            raise(
                ERRCODE_UNDEFINED_COLUMN,
                format!("column {} of table {name} does not exist", quote_ident(missing)),
                LIST_DETAIL,
                Some(format!("Its columns: {}.", names(table.columns.iter().map(|c| &c.name)))),
            );
        }
        if let (Some(publication), Some(published)) = (publication, &published) {
            if let Some(withheld) = given.iter().find(|c| !published.contains(c)) {
                raise(
                    ERRCODE_INSUFFICIENT_PRIVILEGE,
                    format!("publication \"{publication}\" withholds column {} of table {name}", quote_ident(withheld)),
                    format!(
                        "Of the table's columns it publishes ({}): a backfill for the publication's consumer \
                         sends no column the publication does not.",
                        names(published.iter())
                    ),
                    Some("Leave columns => out to send the publication's columns, or list only those.".into()),
                );
            }
        }
    }
    let list = given.map(<[String]>::to_vec).or(published)?;
    if let Some(key) = table.key.iter().find(|k| !list.contains(&k.name)) {
        let whose = if given.is_some() { "the column list" } else { "the column list of publication" };
        let publication = if given.is_some() { String::new() } else { format!(" \"{}\"", publication.unwrap_or("")) };
        raise(
            ERRCODE_INVALID_PARAMETER_VALUE,
            format!("{whose}{publication} leaves out key column {} of table {name}", quote_ident(&key.name)),
            "Every read carries its row's key: the consumer orders it against the key's changes, and applies it by key.",
            Some(format!("The key is ({}): add its columns to the list.", names(table.key.iter().map(|k| &k.name)))),
        );
    }
    // In the table's order.
    Some(table.columns.iter().filter(|c| list.contains(&c.name)).map(|c| c.name.clone()).collect())
}

/// `table` as a backfill with column list `list` reads it (see [`Table::project`]), with the
/// list's attribute numbers. `recorded`: the numbers the backfill started with. An error naming
/// the column if one of the list is gone, or is another column now (renamed, with another
/// given its name; dropped and added again): a worker's scan re-reads its table as it is, and
/// must never send another column's values under a listed name.
pub fn project(table: Table, list: Option<Vec<String>>, recorded: Option<&[i16]>) -> Table {
    let name = table.qualified_name();
    let gone = |column: &str| -> ! {
        raise(
            ERRCODE_UNDEFINED_COLUMN,
            format!("column {} of table {name} is no longer the column the backfill started with", quote_ident(column)),
            "It is in the backfill's column list: it was dropped or renamed since the backfill started (a column \
             of that name now is another one).",
            Some("Cancel the backfill, and start a new one with the columns the table has now.".into()),
        )
    };
    let relid = table.relid;
    let mut table = table.project(list).unwrap_or_else(|missing| gone(&missing));
    let Some(list) = &table.column_list else { return table };
    let attnums = crate::pg::spi::select_one::<Vec<i16>>(
        "SELECT ARRAY(SELECT a.attnum FROM pg_catalog.unnest($2::pg_catalog.text[]) WITH ORDINALITY l(name, i)
                        JOIN pg_catalog.pg_attribute a ON a.attrelid OPERATOR(pg_catalog.=) $1
                         AND a.attname::pg_catalog.text OPERATOR(pg_catalog.=) l.name
                         AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped
                       ORDER BY l.i)",
        &[relid.into(), crate::pg::encoding::texts(list).into()],
    )
    .or_internal("read the listed columns' numbers")
    .unwrap_or_default();
    if let Some(recorded) = recorded {
        if let Some(i) = (0..list.len()).find(|i| attnums.get(*i) != recorded.get(*i)) {
            gone(&list[i]);
        }
    }
    table.column_attnums = attnums;
    table
}

/// A backfill's reads still send nothing the publication withholds, whose column list may have
/// changed since it started (ALTER PUBLICATION ... SET TABLE t (a, b)): checked at every page,
/// with `published`, the publication's columns now ([`crate::selection::publication::published`]).
pub fn require_still_published(publication: &str, table: &Table, published: Option<&[String]>) {
    let Some(published) = published else { return };
    if let Some(withheld) = table.columns.iter().find(|c| !published.contains(&c.name)) {
        let name = table.qualified_name();
        raise(
            ERRCODE_INSUFFICIENT_PRIVILEGE,
            format!(
                "publication \"{publication}\" no longer publishes column {} of table {name}",
                quote_ident(&withheld.name)
            ),
            format!(
                "The columns it publishes of the table became ({}) during the backfill, whose reads carry ({}).",
                names(published.iter()),
                names(table.columns.iter().map(|c| &c.name))
            ),
            Some("Cancel the backfill and start a new one: it sends the publication's columns.".into()),
        );
    }
}

/// `a, "B", c`: names as SQL quotes them, for a message (the first 20).
fn names<'a>(names: impl Iterator<Item = &'a String>) -> String {
    let names: Vec<String> = names.map(|n| quote_ident(n)).collect();
    match names.len() {
        0..=20 => names.join(", "),
        more => format!("{}, ... ({more} in all)", names[..20].join(", ")),
    }
}
