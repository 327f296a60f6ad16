//! The database's encoding and UTF-8.
//!
//! Messages are UTF-8 JSON whatever the database's encoding, and Rust strings are UTF-8, but
//! PostgreSQL hands out text (values, names, errors) in the database's encoding. pgrx converts
//! no text: in a LATIN1 database it panics on a non-ASCII `String`, and a Rust string passed as
//! a parameter arrives as UTF-8 bytes the server takes for LATIN1. So text crosses here:
//!
//! - from the server: [`to_utf8`] (values being rendered) and [`Text`] (names, keys, anything
//!   read through SPI), converted as `convert_to(value, 'UTF8')` converts;
//! - to the server: [`Text`] as a parameter, converted back; key values (cursors and range
//!   bounds) stay in the database's encoding as [`KeyText`], so that they go back byte for
//!   byte as they came;
//! - into SQL text: [`quote_ident`] writes a non-ASCII name as a Unicode escape
//!   (`U&"cl\00e9"`) in a database that is neither UTF-8 nor SQL_ASCII, so that the statements
//!   pg_backfill writes are ASCII, the same bytes in every such encoding;
//! - into error messages: `errors::raise` escapes what is not ASCII when the database is not
//!   UTF-8, since pgrx passes a message's bytes through as they are.
//!
//! In a UTF-8 database every conversion here is a no-op that borrows.

use pgrx::datum::{FromDatum, IntoDatum, UnboxDatum};
use pgrx::pg_sys;
use pgrx::varlena::{vardata_any, varsize_any_exhdr};
use std::borrow::Cow;
use std::fmt::Write;
use std::sync::OnceLock;

/// The database's encoding (fixed for a session), and how its text becomes UTF-8.
#[derive(Clone, Copy)]
enum Server {
    Utf8,
    /// SQL_ASCII: bytes with no declared encoding. As convert_to does, they pass if they are
    /// valid UTF-8 and are refused if not.
    SqlAscii,
    /// Any other encoding, converted by its default conversion to UTF-8.
    Other {
        encoding: i32,
        to_utf8: pg_sys::Oid,
    },
}

fn server() -> Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    *SERVER.get_or_init(|| {
        // SAFETY: the session's database encoding, fixed once connected; the conversion's
        // lookup is a catalog read, and the first text converted is always read in a transaction.
        unsafe {
            match pg_sys::GetDatabaseEncoding() as u32 {
                pg_sys::pg_enc::PG_UTF8 => Server::Utf8,
                pg_sys::pg_enc::PG_SQL_ASCII => Server::SqlAscii,
                encoding => Server::Other {
                    encoding: encoding as i32,
                    to_utf8: pg_sys::FindDefaultConversionProc(encoding as i32, pg_sys::pg_enc::PG_UTF8 as i32),
                },
            }
        }
    })
}

pub fn database_encoding_name() -> String {
    // SAFETY: the name of the session's encoding, a static string.
    unsafe { std::ffi::CStr::from_ptr(pg_sys::GetDatabaseEncodingName()) }.to_string_lossy().into_owned()
}

pub fn database_is_utf8() -> bool {
    matches!(server(), Server::Utf8)
}

/// Whether SQL text in UTF-8 reads as written here: in a UTF-8 or SQL_ASCII database.
pub fn database_takes_utf8() -> bool {
    matches!(server(), Server::Utf8 | Server::SqlAscii)
}

/// Text in the database's encoding as UTF-8, or None when it has no UTF-8 form (bytes that are
/// not UTF-8 in a SQL_ASCII database, or a character with no Unicode mapping).
pub fn to_utf8(bytes: &[u8]) -> Option<Cow<'_, [u8]>> {
    match server() {
        Server::Utf8 => Some(Cow::Borrowed(bytes)),
        Server::SqlAscii => std::str::from_utf8(bytes).ok().map(|_| Cow::Borrowed(bytes)),
        Server::Other { encoding, to_utf8 } if !bytes.is_ascii() => convert(bytes, encoding, to_utf8).map(Cow::Owned),
        Server::Other { .. } => Some(Cow::Borrowed(bytes)),
    }
}

/// Converts in chunks, so that the output buffer's size stays an `int` whatever the value's.
fn convert(mut bytes: &[u8], encoding: i32, proc_: pg_sys::Oid) -> Option<Vec<u8>> {
    const CHUNK: usize = 64 * 1024;
    let growth = pg_sys::MAX_CONVERSION_GROWTH as usize;
    let mut out = Vec::with_capacity(bytes.len() + bytes.len() / 2);
    let mut buffer = vec![0u8; bytes.len().min(CHUNK) * growth + 1];
    while !bytes.is_empty() {
        let chunk = &bytes[..bytes.len().min(CHUNK)];
        // SAFETY: `buffer` holds the worst-case growth of `chunk` plus the terminating NUL; with
        // noError the conversion stops at the first character it cannot convert (or that the
        // chunk cuts) instead of raising, and returns how many input bytes it converted. The
        // function reads `chunk` and does not write it (its parameter is not const in C).
        let converted = unsafe {
            pg_sys::pg_do_encoding_conversion_buf(
                proc_,
                encoding,
                pg_sys::pg_enc::PG_UTF8 as i32,
                chunk.as_ptr().cast_mut(),
                chunk.len() as i32,
                buffer.as_mut_ptr(),
                (chunk.len() * growth + 1) as i32,
                true,
            )
        } as usize;
        if converted == 0 {
            return None;
        }
        let written = buffer.iter().position(|&b| b == 0).unwrap_or(0);
        out.extend_from_slice(&buffer[..written]);
        bytes = &bytes[converted..];
    }
    Some(out)
}

/// UTF-8 text in the database's encoding. Only text that came from this database goes back
/// to it, so the conversion cannot fail (PostgreSQL raises 22P05 if it ever does).
pub fn to_server(text: &str) -> Cow<'_, [u8]> {
    // SQL_ASCII too: its text was read as UTF-8 bytes, and goes back as the same bytes.
    if text.is_ascii() || !matches!(server(), Server::Other { .. }) {
        return Cow::Borrowed(text.as_bytes());
    }
    // SAFETY: pg_any_to_server reads `len` bytes and returns them, or a palloc'd NUL-terminated
    // conversion of them, in the current memory context; it is copied out at once.
    unsafe {
        let converted =
            pg_sys::pg_any_to_server(text.as_ptr().cast(), text.len() as i32, pg_sys::pg_enc::PG_UTF8 as i32);
        if converted.cast_const() == text.as_ptr().cast() {
            Cow::Borrowed(text.as_bytes())
        } else {
            Cow::Owned(std::ffi::CStr::from_ptr(converted).to_bytes().to_vec())
        }
    }
}

/// An identifier quoted for SQL that pg_backfill writes, as quote_ident quotes it; in a database
/// that is neither UTF-8 nor SQL_ASCII, a name with a character that is not ASCII is written as a Unicode-escaped
/// identifier (`U&"cl\00e9"`), which PostgreSQL reads in any server encoding that has the
/// character.
pub fn quote_ident(name: &str) -> String {
    // (A SQL_ASCII database reads no Unicode escape, but takes a name's UTF-8 bytes as they are.)
    if name.is_ascii() || !matches!(server(), Server::Other { .. }) {
        return pgrx::spi::quote_identifier(name);
    }
    quote_ident_escaped(name)
}

/// A text quoted as an SQL literal that pg_backfill writes, as quote_literal quotes it; in a
/// database that is neither UTF-8 nor SQL_ASCII, a text with a character that is not ASCII is
/// written as its UTF-8 bytes converted (`pg_catalog.convert_from(E'\\x...', 'UTF8')`): SQL
/// in ASCII, read alike whatever `standard_conforming_strings` says (a `U&'...'` literal is
/// refused when it is off).
pub fn quote_literal(text: &str) -> String {
    if text.is_ascii() || !matches!(server(), Server::Other { .. }) {
        return pgrx::spi::quote_literal(text);
    }
    let hex: String = text.bytes().map(|b| format!("{b:02x}")).collect();
    format!("pg_catalog.convert_from(E'\\\\x{hex}'::pg_catalog.bytea, 'UTF8')")
}

/// `U&"..."`, every character that is not ASCII escaped.
fn quote_ident_escaped(name: &str) -> String {
    let mut quoted = String::from("U&\"");
    for c in name.chars() {
        match c {
            '"' => quoted.push_str("\"\""),
            '\\' => quoted.push_str("\\\\"),
            c if c.is_ascii() => quoted.push(c),
            c if (c as u32) <= 0xffff => {
                let _ = write!(quoted, "\\{:04x}", c as u32);
            }
            c => {
                let _ = write!(quoted, "\\+{:06x}", c as u32);
            }
        }
    }
    quoted.push('"');
    quoted
}

/// `schema.name`, each quoted by [`quote_ident`].
pub fn quote_qualified(schema: &str, name: &str) -> String {
    format!("{}.{}", quote_ident(schema), quote_ident(name))
}

/// A text datum's bytes (detoasted, when it must be, in the current memory context).
///
/// # Safety
/// `datum` is a non-null varlena datum.
pub unsafe fn text_of<'a>(datum: pg_sys::Datum) -> &'a [u8] {
    // SAFETY: as the caller promises.
    let value = pg_sys::pg_detoast_datum_packed(datum.cast_mut_ptr());
    std::slice::from_raw_parts(vardata_any(value).cast::<u8>(), varsize_any_exhdr(value))
}

/// FromDatum, UnboxDatum (array elements) and IntoDatum for a text type of ours: a datum is read
/// by the type's `from_text_datum`, and made of the bytes its `server_bytes` gives.
macro_rules! text_datum {
    ($type:ident) => {
        impl FromDatum for $type {
            unsafe fn from_polymorphic_datum(
                datum: pg_sys::Datum,
                is_null: bool,
                _typoid: pg_sys::Oid,
            ) -> Option<$type> {
                // SAFETY: a non-null text datum, as the caller promises for its type.
                (!is_null).then(|| unsafe { $type::from_text_datum(datum) })
            }
        }

        // SAFETY: unboxes a text datum (an array's element) the way FromDatum does.
        unsafe impl UnboxDatum for $type {
            type As<'src> = $type;
            unsafe fn unbox<'src>(datum: pgrx::datum::Datum<'src>) -> $type
            where
                Self: 'src,
            {
                // SAFETY: an array element of type text is never null here (nulls are not unboxed).
                unsafe { $type::from_text_datum(datum.sans_lifetime()) }
            }
        }

        impl IntoDatum for $type {
            fn into_datum(self) -> Option<pg_sys::Datum> {
                let bytes = self.server_bytes();
                // SAFETY: copies `len` bytes into a new text datum in the current memory context.
                Some(pg_sys::Datum::from(unsafe {
                    pg_sys::cstring_to_text_with_len(bytes.as_ptr().cast(), bytes.len() as i32)
                }))
            }

            fn type_oid() -> pg_sys::Oid {
                pg_sys::TEXTOID
            }

            fn is_compatible_with(other: pg_sys::Oid) -> bool {
                [pg_sys::TEXTOID, pg_sys::VARCHAROID, pg_sys::BPCHAROID].contains(&other)
            }
        }
    };
}

/// Text read from, or passed to, SPI and converted between the database's encoding and UTF-8:
/// use it instead of `String` wherever a value may not be ASCII.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Text(pub String);

impl Text {
    /// The text in the database's encoding.
    fn server_bytes(&self) -> Cow<'_, [u8]> {
        to_server(&self.0)
    }

    /// # Safety
    /// `datum` is a non-null text (or varchar, or bpchar) datum.
    unsafe fn from_text_datum(datum: pg_sys::Datum) -> Text {
        let bytes = text_of(datum);
        let utf8 = to_utf8(bytes).unwrap_or_else(|| not_utf8(bytes));
        match String::from_utf8(utf8.into_owned()) {
            Ok(text) => Text(text),
            Err(e) => not_utf8(e.as_bytes()),
        }
    }
}

/// Text of this database that has no UTF-8 form: what convert_to raises.
fn not_utf8(bytes: &[u8]) -> ! {
    crate::pg::errors::raise(
        pgrx::PgSqlErrorCode::ERRCODE_CHARACTER_NOT_IN_REPERTOIRE,
        "text has no UTF-8 form",
        format!(
            "The text begins {:?}; pg_backfill works in UTF-8.",
            String::from_utf8_lossy(&bytes[..bytes.len().min(40)])
        ),
        Some("Store the text in this database's encoding (in SQL_ASCII, as UTF-8).".into()),
    )
}

text_datum!(Text);

// A Text returned by a SQL function is text, converted to the database's encoding.
pgrx::impl_sql_translatable!(Text, "text");

// SAFETY: returns the datum into_datum makes, or SQL NULL, as pgrx does for String.
unsafe impl pgrx::callconv::BoxRet for Text {
    unsafe fn box_into<'fcx>(self, fcinfo: &mut pgrx::callconv::FcInfo<'fcx>) -> pgrx::datum::Datum<'fcx> {
        match self.into_datum() {
            // SAFETY: a datum of the function's declared return type, text.
            Some(datum) => unsafe { fcinfo.return_raw_datum(datum) },
            None => fcinfo.return_null(),
        }
    }
}

// SAFETY: unboxes a text argument through FromDatum, as pgrx does for String.
unsafe impl<'fcx> pgrx::callconv::ArgAbi<'fcx> for Text {
    unsafe fn unbox_arg_unchecked(arg: pgrx::callconv::Arg<'_, 'fcx>) -> Self {
        // SAFETY: the argument is declared text (impl_sql_translatable above).
        unsafe { arg.unbox_arg_using_from_datum() }.unwrap_or_else(|| Text(String::new()))
    }

    unsafe fn unbox_nullable_arg(arg: pgrx::callconv::Arg<'_, 'fcx>) -> pgrx::nullable::Nullable<Self> {
        // SAFETY: as above; SQL NULL becomes Null.
        unsafe { arg.unbox_arg_using_from_datum() }.into()
    }
}

impl From<&str> for Text {
    fn from(text: &str) -> Text {
        Text(text.to_string())
    }
}

/// A key value's text form, kept in the database's encoding: cursors and range bounds go back
/// to the server in the very bytes they came in, since a conversion to UTF-8 and back is not
/// the identity in every encoding (EUC_JP maps some characters one way only). Shown as UTF-8.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyText(Vec<u8>);

impl KeyText {
    /// The key's text, as it came.
    fn server_bytes(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.0)
    }

    /// # Safety
    /// `datum` is a non-null text datum.
    unsafe fn from_text_datum(datum: pg_sys::Datum) -> KeyText {
        KeyText(text_of(datum).to_vec())
    }
}

impl std::fmt::Display for KeyText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match to_utf8(&self.0) {
            Some(utf8) => f.write_str(&String::from_utf8_lossy(&utf8)),
            None => f.write_str(&String::from_utf8_lossy(&self.0)),
        }
    }
}

text_datum!(KeyText);

/// A key's values, shown `a, b`.
pub fn show_key(key: &[KeyText]) -> String {
    key.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

/// Rust strings as [`Text`] parameters.
pub fn texts(values: &[String]) -> Vec<Text> {
    values.iter().map(|v| Text(v.clone())).collect()
}

/// [`Text`]s read back as strings.
pub fn strings(values: Vec<Text>) -> Vec<String> {
    values.into_iter().map(|t| t.0).collect()
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use super::*;
    use pgrx::prelude::*;

    #[pg_test]
    fn non_ascii_names_are_quoted_in_ascii_that_postgresql_reads_back() {
        for name in ["clé", "a\"b\\c", "日本", "emoji😀", "plain", "Mixed Case"] {
            let quoted = quote_ident_escaped(name);
            assert!(quoted.is_ascii(), "{quoted}");
            let named = Spi::get_one::<String>(&format!(
                "SELECT (pg_catalog.json_object_keys(pg_catalog.row_to_json(s))) FROM (SELECT 1 AS {quoted}) s"
            ))
            .unwrap()
            .unwrap();
            assert_eq!(named, name);
        }
    }
}

/// Runs `f` with the client encoding UTF-8, restored however `f` ends: send functions write
/// text in the client's encoding, and the hashes take it in UTF-8, whatever the session's.
pub fn in_utf8<R>(f: impl FnOnce() -> R + std::panic::UnwindSafe) -> R {
    // SAFETY: reads this backend's client encoding.
    let client_encoding = unsafe { pg_sys::pg_get_client_encoding() };
    let utf8 = pg_sys::pg_enc::PG_UTF8 as i32;
    if client_encoding == utf8 {
        return f();
    }
    // SAFETY: looks up (once a backend) the conversion from the database's encoding to UTF-8,
    // which every server encoding has: without it SetClientEncoding() refuses UTF-8 in a
    // database of another encoding (LATIN1), and the text would stay in the client's.
    // Then sets this backend's client encoding to UTF-8; nothing is sent to the client until
    // it is restored below. (Not a transactional setting, hence the explicit restore.)
    let switched = unsafe { pg_sys::PrepareClientEncoding(utf8) == 0 && pg_sys::SetClientEncoding(utf8) == 0 };
    if !switched {
        crate::pg::errors::raise(
            pgrx::PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            "could not convert the database's encoding to UTF-8 for the row hashes",
            format!("PostgreSQL found no conversion from {} to UTF-8.", database_encoding_name()),
            Some(
                "Every server encoding has a built-in conversion to UTF-8: look for a default conversion that \
                 replaced it (CREATE DEFAULT CONVERSION, pg_conversion)."
                    .into(),
            ),
        );
    }
    pgrx::PgTryBuilder::new(f)
        .finally(|| {
            // SAFETY: as above, back to what it was (prepared when the session chose it).
            unsafe { pg_sys::SetClientEncoding(client_encoding) };
        })
        .execute()
}
