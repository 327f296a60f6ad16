//! A row as JSON, rendered from its column values exactly as `row_to_json` renders it.
//!
//! `row_to_json(t)` first forms a composite datum of the whole row, then, for every column of
//! every row, looks the column's type up in the catalog cache before calling its output
//! function: about a quarter of a backfill's time in the profile. The page query returns the
//! columns themselves instead. The types most tables are made of are rendered here with the
//! rules of PostgreSQL's json.c (numbers bare unless NaN or infinite, booleans bare, json as it
//! is, every other value a quoted, escaped string); the query applies `to_json()` to the other
//! columns (dates and times, arrays, composites, domains, types with a cast to json), whose
//! rules are PostgreSQL's own. The text is the same byte for byte: the tests compare the two.

use crate::model::table::Column;
use crate::pg::compat;
use crate::pg::encoding::quote_ident as quote_identifier;
use crate::pg::encoding::text_of;
use pgrx::prelude::*;
use std::ffi::CStr;

/// How one column's value becomes JSON.
#[derive(Debug, Clone, Copy)]
enum Render {
    Int2,
    Int4,
    Int8,
    Bool,
    /// text, varchar, bpchar: the value itself, quoted (their output functions copy it as is).
    Text,
    /// json, and the `to_json()` the query applied: already JSON.
    Json,
    /// float4, float8, numeric: the output function's text, quoted when it is NaN or infinite.
    Number,
    /// jsonb: the output function's text is JSON.
    Raw,
    /// uuid, name: the output function's text, quoted.
    Quoted,
}

/// The rendering of a built-in type, or None when the query renders it with `to_json()`.
/// (json.c looks for a cast to json only for user-defined types, so none of these has one.)
fn render_of(type_oid: pg_sys::Oid) -> Option<Render> {
    use pg_sys::*;
    Some(match type_oid {
        INT2OID => Render::Int2,
        INT4OID => Render::Int4,
        INT8OID => Render::Int8,
        BOOLOID => Render::Bool,
        TEXTOID | VARCHAROID | BPCHAROID => Render::Text,
        JSONOID => Render::Json,
        FLOAT4OID | FLOAT8OID | NUMERICOID => Render::Number,
        JSONBOID => Render::Raw,
        UUIDOID | NAMEOID => Render::Quoted,
        _ => return None,
    })
}

/// The page query's select list: each column, or its `to_json()` text where PostgreSQL renders it.
pub fn select_list(columns: &[Column]) -> String {
    columns
        .iter()
        .map(|c| match render_of(c.type_oid) {
            Some(_) => format!("t.{}", quote_identifier(&c.name)),
            None => format!("pg_catalog.to_json(t.{})::pg_catalog.text", quote_identifier(&c.name)),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Appends `value` as a JSON string, escaped as json.c's escape_json does. Values are UTF-8
/// (see [`render`](RowJson::render)): only ASCII bytes are ever escaped.
pub fn push_quoted(buf: &mut Vec<u8>, value: &[u8]) {
    buf.reserve(value.len() + 2);
    buf.push(b'"');
    // Most text has nothing to escape: 16 bytes are tested at once (a branch-free test that
    // the compiler vectorizes) and copied whole; only a block with something to escape, and
    // the last few bytes, go byte by byte.
    let blocks = value.chunks_exact(16);
    let rest = blocks.remainder();
    for block in blocks {
        if block.iter().fold(false, |any, &byte| any | (byte < 0x20) | (byte == b'"') | (byte == b'\\')) {
            push_escaped(buf, block);
        } else {
            buf.extend_from_slice(block);
        }
    }
    push_escaped(buf, rest);
    buf.push(b'"');
}

fn push_escaped(buf: &mut Vec<u8>, bytes: &[u8]) {
    for &byte in bytes {
        match byte {
            b'"' => buf.extend_from_slice(b"\\\""),
            b'\\' => buf.extend_from_slice(b"\\\\"),
            b'\n' => buf.extend_from_slice(b"\\n"),
            b'\r' => buf.extend_from_slice(b"\\r"),
            b'\t' => buf.extend_from_slice(b"\\t"),
            0x08 => buf.extend_from_slice(b"\\b"),
            0x0c => buf.extend_from_slice(b"\\f"),
            0..=0x1f => buf.extend_from_slice(format!("\\u{byte:04x}").as_bytes()),
            _ => buf.push(byte),
        }
    }
}

/// `"name":`, a column's name as a JSON object's key.
pub fn label(name: &str) -> Vec<u8> {
    let mut label = Vec::with_capacity(name.len() + 3);
    push_quoted(&mut label, name.as_bytes());
    label.push(b':');
    label
}

/// Renders the rows of one table into one reused buffer.
pub struct RowJson {
    /// The columns rendered, as the table had them when this was made.
    columns: Vec<Column>,
    /// With a column list, its columns' attribute numbers (the others do not matter); None:
    /// they are all the table's columns, and a column added to the table is one to render too.
    listed_attnums: Option<Vec<i16>>,
    /// `"name":` of each column, quoted once; the first with the object's opening brace.
    labels: Vec<Vec<u8>>,
    renders: Vec<Render>,
    /// Each column's output function (a catalog lookup done once, not per row as json.c does).
    outputs: Vec<pg_sys::Oid>,
    /// Where each column's value is in `buf`.
    spans: Vec<(usize, usize)>,
    buf: Vec<u8>,
    /// Output functions and detoasting allocate here; it is reset for every row.
    memory: pg_sys::MemoryContext,
}

impl RowJson {
    /// Looks the columns' output functions up: in a transaction. `listed_attnums`: with a column
    /// list, the attribute numbers of `columns`.
    pub fn new(columns: &[Column], listed_attnums: Option<Vec<i16>>) -> Self {
        let labels = columns
            .iter()
            .enumerate()
            .map(|(i, column)| [&[if i == 0 { b'{' } else { b',' }][..], &label(&column.name)].concat())
            .collect();
        let outputs = columns
            .iter()
            .map(|c| {
                let (mut function, mut varlena) = (pg_sys::InvalidOid, false);
                // SAFETY: a catalog-cache lookup of the type's output function, in a transaction.
                unsafe { pg_sys::getTypeOutputInfo(c.type_oid, &mut function, &mut varlena) };
                function
            })
            .collect();
        // Last: nothing after it can fail and leave it behind.
        // SAFETY: a child of TopMemoryContext, deleted when this is dropped.
        let memory = unsafe {
            pg_sys::AllocSetContextCreateInternal(
                pg_sys::TopMemoryContext,
                c"backfill row".as_ptr(),
                0,
                pg_sys::ALLOCSET_DEFAULT_INITSIZE as usize,
                pg_sys::ALLOCSET_DEFAULT_MAXSIZE as usize,
            )
        };
        RowJson {
            columns: columns.to_vec(),
            listed_attnums,
            labels,
            renders: columns.iter().map(|c| render_of(c.type_oid).unwrap_or(Render::Json)).collect(),
            outputs,
            spans: Vec::with_capacity(columns.len()),
            buf: Vec::with_capacity(8192),
            memory,
        }
    }

    /// Whether a relation's columns are still the ones rendered (no ALTER TABLE added, dropped
    /// or retyped one; with a column list, one of its columns: the others do not matter).
    ///
    /// # Safety
    /// `descriptor` is an open relation's.
    pub unsafe fn describes(&self, descriptor: pg_sys::TupleDesc) -> bool {
        let attributes = compat::tuple_attributes(descriptor);
        let mut now = attributes.iter().filter(|a| !a.attisdropped);
        // Names compared as UTF-8, as they were read (see encoding.rs).
        let named = |a: &pg_sys::FormData_pg_attribute, name: &str| {
            crate::pg::encoding::to_utf8(CStr::from_ptr(a.attname.data.as_ptr()).to_bytes()).as_deref()
                == Some(name.as_bytes())
        };
        if let Some(attnums) = &self.listed_attnums {
            // Each listed column still itself: at its attribute number, with its name and type.
            return self.columns.iter().zip(attnums).all(|(c, attnum)| {
                let attribute = usize::try_from(*attnum - 1).ok().and_then(|i| attributes.get(i));
                attribute.is_some_and(|a| !a.attisdropped && a.atttypid == c.type_oid && named(a, &c.name))
            });
        }
        self.columns.iter().all(|c| now.next().is_some_and(|a| a.atttypid == c.type_oid && named(a, &c.name)))
            && now.next().is_none()
    }

    /// Whether a page query's result has the columns rendered, in order: each in its own type,
    /// or as the text of its `to_json()`. Values are read by those types: a mismatch must never
    /// reach [`render`](Self::render).
    pub fn matches(&self, result: pg_sys::TupleDesc) -> bool {
        // SAFETY: `result` is the descriptor the executor passes to the receiver's startup.
        unsafe {
            let attributes = compat::tuple_attributes(result);
            attributes.len() >= self.columns.len()
                && self.columns.iter().zip(attributes).all(|(c, a)| {
                    a.atttypid == if render_of(c.type_oid).is_some() { c.type_oid } else { pg_sys::TEXTOID }
                })
        }
    }

    /// Renders one row from the page query's values (one per column, in order), in UTF-8
    /// whatever the database's encoding (converted as `convert_to(value, 'UTF8')` would). Stops
    /// as soon as the JSON grows past `max_len` bytes: a row too large to deliver is never
    /// rendered whole, so the worker's memory stays within `max_len` and one column.
    ///
    /// # Safety
    /// `values` and `nulls` are the slot's, for a query made with [`select_list`].
    pub unsafe fn render(&mut self, values: &[pg_sys::Datum], nulls: &[bool], max_len: usize) -> Rendered {
        pg_sys::MemoryContextReset(self.memory);
        let caller = pg_sys::MemoryContextSwitchTo(self.memory);
        self.buf.clear();
        self.spans.clear();
        let mut rendered = Rendered::Row;
        for (i, render) in self.renders.iter().enumerate() {
            self.buf.extend_from_slice(&self.labels[i]);
            let start = self.buf.len();
            if nulls[i] {
                self.buf.extend_from_slice(b"null");
            } else if push_value(&mut self.buf, *render, self.outputs[i], values[i]).is_none() {
                rendered = Rendered::NotUtf8 { column: i };
                break;
            }
            self.spans.push((start, self.buf.len()));
            if self.buf.len() > max_len {
                rendered = Rendered::TooLarge;
                break;
            }
        }
        if self.renders.is_empty() {
            self.buf.push(b'{');
        }
        self.buf.push(b'}');
        pg_sys::MemoryContextSwitchTo(caller);
        rendered
    }

    /// A column's name.
    pub fn column_name(&self, column: usize) -> &str {
        &self.columns[column].name
    }

    /// Some columns' values of a row as JSON, `"a", 2`: the key of a row for an error message.
    /// (A value with no UTF-8 form shows its bytes, with U+FFFD for those that are not UTF-8.)
    ///
    /// # Safety
    /// As for [`render`](Self::render).
    pub unsafe fn values_of(&self, values: &[pg_sys::Datum], nulls: &[bool], columns: &[usize]) -> String {
        let mut text = Vec::new();
        for (n, &i) in columns.iter().enumerate() {
            if n > 0 {
                text.extend_from_slice(b", ");
            }
            if nulls[i] {
                text.extend_from_slice(b"null");
            } else if push_value(&mut text, self.renders[i], self.outputs[i], values[i]).is_none() {
                // The output function's text, as it is (any type: a name is not a varlena).
                push_quoted(
                    &mut text,
                    CStr::from_ptr(pg_sys::OidOutputFunctionCall(self.outputs[i], values[i])).to_bytes(),
                );
            }
        }
        String::from_utf8_lossy(&text).into_owned()
    }

    /// The last row rendered, as a JSON object.
    pub fn json(&self) -> &[u8] {
        &self.buf
    }

    /// The last row's value of a column, as JSON.
    pub fn value(&self, column: usize) -> &[u8] {
        let (start, end) = self.spans[column];
        &self.buf[start..end]
    }
}

impl Drop for RowJson {
    fn drop(&mut self) {
        // SAFETY: the context made in new(), deleted once.
        unsafe { pg_sys::MemoryContextDelete(self.memory) };
    }
}

/// What [`RowJson::render`] made of a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rendered {
    Row,
    /// The JSON passed the limit; rendering stopped there.
    TooLarge,
    /// This column's value has no UTF-8 form; rendering stopped there.
    NotUtf8 {
        column: usize,
    },
}

/// Appends a value as JSON; None, with `buf` partly written, when it has no UTF-8 form.
unsafe fn push_value(
    buf: &mut Vec<u8>,
    render: Render,
    output_function: pg_sys::Oid,
    value: pg_sys::Datum,
) -> Option<()> {
    let mut digits = itoa::Buffer::new();
    // Text in the database's encoding (values and output functions' results) as UTF-8.
    let utf8 = |bytes| crate::pg::encoding::to_utf8(bytes);
    let output = || CStr::from_ptr(pg_sys::OidOutputFunctionCall(output_function, value)).to_bytes();
    match render {
        Render::Int2 => buf.extend_from_slice(digits.format(value.value() as i16).as_bytes()),
        Render::Int4 => buf.extend_from_slice(digits.format(value.value() as i32).as_bytes()),
        Render::Int8 => buf.extend_from_slice(digits.format(value.value() as i64).as_bytes()),
        Render::Bool => buf.extend_from_slice(if value.value() != 0 { b"true" } else { b"false" }),
        Render::Text => push_quoted(buf, &utf8(text_of(value))?),
        Render::Json => buf.extend_from_slice(&utf8(text_of(value))?),
        Render::Number => {
            // Finite values print as JSON numbers, which end in a digit; NaN and the
            // infinities do not, and json.c quotes them. (Numbers are ASCII in every encoding.)
            let text = output();
            if text.last().is_some_and(u8::is_ascii_digit) {
                buf.extend_from_slice(text);
            } else {
                push_quoted(buf, text);
            }
        }
        Render::Raw => buf.extend_from_slice(&utf8(output())?),
        Render::Quoted => push_quoted(buf, &utf8(output())?),
    }
    Some(())
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use super::*;

    #[pg_test]
    fn strings_are_escaped_as_postgresql_escapes_them() {
        // Every ASCII character, at every offset of a 16-byte block and in the tail after it.
        for byte in 1u8..=127 {
            for offset in [0usize, 7, 15, 16, 17, 33] {
                let mut value = vec![b'a'; offset];
                value.push(byte);
                value.extend_from_slice(b"bcdefghij");
                let text = String::from_utf8(value).unwrap();
                let expected =
                    Spi::get_one_with_args::<String>("SELECT to_json($1::text)::text", &[text.clone().into()])
                        .unwrap()
                        .unwrap();
                let mut rendered = Vec::new();
                push_quoted(&mut rendered, text.as_bytes());
                assert_eq!(String::from_utf8(rendered).unwrap(), expected, "byte {byte} at {offset}");
            }
        }
    }
}
