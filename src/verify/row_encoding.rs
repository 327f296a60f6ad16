//! How a row becomes the bytes its hash is computed over (the row hash of backfill_checksum()
//! and backfill.row_hash(), whose scan and SQL function are in row_hash.rs).
//!
//! A row's hash is XXH3-64, with seed 0, of its columns in column order (dropped ones aside),
//! each as a byte 0 when NULL, else a byte 1, its length as 4 bytes big endian, and its binary
//! send format (the format of COPY BINARY and of the wire protocol), text in UTF-8. A range's
//! checksum is the exact sum of its rows' hashes read as signed 64-bit integers: the same rows
//! give the same sum in any order, and a duplicate row changes it. Send formats do not depend
//! on TimeZone, DateStyle or extra_float_digits, nor on the architecture: identical rows give
//! identical checksums on every server. (0.5.0 hashed the same bytes with SipHash-2-4; XXH3 reads
//! long values, text above all, about ten times faster.)
//!
//! The common fixed-size types and text are written here as their send functions write them,
//! without calling them (a call allocates its result); numeric and jsonb are read from their
//! stored form (numeric_jsonb.rs: jsonb's encoding is the tokens of a walk of the document, not
//! its send format); every other type calls its send function. Where values that SQL finds
//! equal have different send formats, the hash follows SQL: every float NaN is hashed as one,
//! and -0 as 0. Arrays and composites are walked element by element (their send formats carry
//! their element types' OIDs, another server's for an enum), so a float in them is hashed the
//! same way. A domain is hashed as its base type.

use crate::pg::compat;
use crate::verify::numeric_jsonb::{encode_jsonb, encode_numeric, length_prefixed, utf8};
use pgrx::prelude::*;

/// How one column's value enters its row's hash: its send format, but where SQL equality
/// holds between values whose send formats differ (floats), and for arrays and composites,
/// whose send formats carry their elements' type OIDs (another server's, for an enum) and send
/// text in the client's encoding.
enum Encoding {
    /// A by-value integer of this many bytes, big endian: int2, int4, int8, oid, date, time,
    /// timestamp, timestamptz, bool.
    BigEndian(usize),
    /// float4 (4) or float8 (8): its bits, big endian, with every NaN as the one NaN and -0 as
    /// 0 (SQL finds them equal: 'Infinity' - 'Infinity' is a NaN of other bits than 'NaN').
    Float(usize),
    /// uuid: its 16 bytes.
    Uuid,
    /// text, varchar, bpchar: the characters in UTF-8.
    Text,
    /// numeric: its send format, read from the value (see [`encode_numeric`]).
    Numeric,
    /// jsonb: the tokens of a walk of the document (see [`encode_jsonb`]).
    Jsonb,
    /// An array: its dimension count, each dimension's length and lower bound (4 bytes big
    /// endian each), then each element as a column is written (NULL or length and encoding).
    Array(Box<ArrayElement>),
    /// A composite value: its columns as a row's are written (dropped ones aside).
    Composite(RowHasher),
    /// Anything else: its type's send function.
    Send(Box<pg_sys::FmgrInfo>),
}

/// The element type of an array column, and how its elements enter the hash.
struct ArrayElement {
    type_oid: pg_sys::Oid,
    length: i16,
    by_value: bool,
    align: std::ffi::c_char,
    encoding: Encoding,
}

/// Hashes rows of one row type.
pub struct RowHasher {
    /// One per column, None for a dropped one.
    encodings: Vec<Option<Encoding>>,
    /// The row being encoded (kept from row to row, to allocate it once).
    encoded: Vec<u8>,
}

impl RowHasher {
    /// For rows of `tupdesc`, from its column `first` on.
    ///
    /// # Safety
    /// `tupdesc` is a valid tuple descriptor.
    pub unsafe fn new(tupdesc: pg_sys::TupleDesc, first: usize) -> Self {
        let attributes = compat::tuple_attributes(tupdesc);
        let encodings =
            attributes[first..].iter().map(|att| (!att.attisdropped).then(|| encoding_of(att.atttypid))).collect();
        RowHasher { encodings, encoded: Vec::new() }
    }

    /// Whether every column is encoded here or by a built-in send function: one a parallel
    /// worker may call (a user-defined type's could do anything).
    pub fn built_in(&self) -> bool {
        self.encodings.iter().flatten().all(Encoding::built_in)
    }

    /// The hash of one row's values (those from the descriptor's column `first` on).
    ///
    /// # Safety
    /// The values are of the descriptor's types; a non-null one is a valid datum.
    /// What it allocates (detoasted values, send formats) is left to the current memory context,
    /// which the caller resets.
    pub unsafe fn hash(&mut self, values: &[pg_sys::Datum], nulls: &[bool]) -> u64 {
        let mut encoded = std::mem::take(&mut self.encoded);
        encoded.clear();
        self.encode_row(values, nulls, &mut encoded);
        let hash = xxhash_rust::xxh3::xxh3_64(&encoded);
        self.encoded = encoded;
        hash
    }

    /// Appends the encoding of a row's values to `encoded`.
    ///
    /// # Safety
    /// As [`RowHasher::hash`].
    unsafe fn encode_row(&mut self, values: &[pg_sys::Datum], nulls: &[bool], encoded: &mut Vec<u8>) {
        for ((encoding, value), null) in self.encodings.iter_mut().zip(values).zip(nulls) {
            let Some(encoding) = encoding else { continue };
            encode_value(encoding, *value, *null, encoded);
        }
    }
}

impl Encoding {
    fn built_in(&self) -> bool {
        match self {
            Encoding::Send(send) => send.fn_oid.to_u32() < pg_sys::FirstNormalObjectId,
            Encoding::Array(element) => element.encoding.built_in(),
            Encoding::Composite(row) => row.built_in(),
            _ => true,
        }
    }
}

/// Appends one value as a column is written: a byte 0 when NULL, else a byte 1, its length and
/// its encoding.
///
/// # Safety
/// A non-null `value` is a valid datum of the encoding's type.
unsafe fn encode_value(encoding: &mut Encoding, value: pg_sys::Datum, null: bool, encoded: &mut Vec<u8>) {
    if null {
        encoded.push(0);
        return;
    }
    length_prefixed(encoded, 1, |encoded| match encoding {
        Encoding::BigEndian(size) => encoded.extend_from_slice(&value.value().to_be_bytes()[8 - *size..]),
        Encoding::Float(4) => encoded.extend_from_slice(&canonical_float4(value).to_be_bytes()),
        Encoding::Float(_) => encoded.extend_from_slice(&canonical_float8(value).to_be_bytes()),
        Encoding::Uuid => encoded.extend_from_slice(std::slice::from_raw_parts(value.cast_mut_ptr::<u8>(), 16)),
        Encoding::Text => {
            let bytes = crate::pg::encoding::text_of(value);
            encoded.extend_from_slice(&utf8(bytes))
        }
        Encoding::Numeric => encode_numeric(pg_sys::pg_detoast_datum_packed(value.cast_mut_ptr()), encoded),
        Encoding::Jsonb => encode_jsonb(value, encoded),
        Encoding::Array(element) => encode_array(element, value, encoded),
        Encoding::Composite(row) => encode_composite(row, value, encoded),
        Encoding::Send(send) => {
            let sent = pg_sys::SendFunctionCall(&mut **send, value);
            encoded.extend_from_slice(pgrx::varlena::varlena_to_byte_slice(sent))
        }
    });
}

/// A float4's bits as SQL equality sees them: one NaN, and -0 as 0.
fn canonical_float4(value: pg_sys::Datum) -> u32 {
    let float = f32::from_bits(value.value() as u32);
    if float.is_nan() {
        f32::NAN.to_bits()
    } else if float == 0.0 {
        0
    } else {
        float.to_bits()
    }
}

/// A float8's bits as SQL equality sees them: one NaN, and -0 as 0.
fn canonical_float8(value: pg_sys::Datum) -> u64 {
    let float = f64::from_bits(value.value() as u64);
    if float.is_nan() {
        f64::NAN.to_bits()
    } else if float == 0.0 {
        0
    } else {
        float.to_bits()
    }
}

/// # Safety
/// `value` is an array of the element's type.
unsafe fn encode_array(element: &mut ArrayElement, value: pg_sys::Datum, encoded: &mut Vec<u8>) {
    let array = pg_sys::pg_detoast_datum(value.cast_mut_ptr()).cast::<pg_sys::ArrayType>();
    let dimensions = (*array).ndim.max(0) as usize;
    // SAFETY: an array's header is followed by its dimensions' lengths, then their lower bounds
    // (ARR_DIMS and ARR_LBOUND), `ndim` 4-byte integers each.
    let sizes = std::slice::from_raw_parts(array.add(1).cast::<i32>(), dimensions * 2);
    encoded.extend_from_slice(&(dimensions as i32).to_be_bytes());
    for size in sizes {
        encoded.extend_from_slice(&size.to_be_bytes());
    }
    let (mut values, mut nulls, mut count) = (std::ptr::null_mut(), std::ptr::null_mut(), 0);
    pg_sys::deconstruct_array(
        array,
        element.type_oid,
        element.length.into(),
        element.by_value,
        element.align,
        &mut values,
        &mut nulls,
        &mut count,
    );
    for i in 0..count as usize {
        encode_value(&mut element.encoding, *values.add(i), *nulls.add(i), encoded);
    }
}

/// A composite datum's row type, as its header records it, for lookup_rowtype_tupdesc(): its type
/// OID, and the typmod of an anonymous record (the id of its blessed descriptor), -1 otherwise.
///
/// Minors that version composite datums (CVE-2026-6460's fix: 15.20, 17.12) keep a named row
/// type's version in the typmod's place: not a typmod, and left to heap_deform_tuple(), which on
/// those minors refuses a datum made before its type was altered (22P07) rather than read it
/// with the type's new columns. Records are never versioned.
///
/// # Safety
/// `header` is a detoasted composite datum.
pub(crate) unsafe fn row_type_of(header: pg_sys::HeapTupleHeader) -> (pg_sys::Oid, i32) {
    let fields = &(*header).t_choice.t_datum;
    let typmod = if fields.datum_typeid == pg_sys::RECORDOID { fields.datum_typmod } else { -1 };
    (fields.datum_typeid, typmod)
}

/// # Safety
/// `value` is a composite datum of the row's type.
unsafe fn encode_composite(row: &mut RowHasher, value: pg_sys::Datum, encoded: &mut Vec<u8>) {
    let header = pg_sys::pg_detoast_datum(value.cast_mut_ptr()) as pg_sys::HeapTupleHeader;
    let row_type = row_type_of(header);
    let tupdesc = pg_sys::lookup_rowtype_tupdesc(row_type.0, row_type.1);
    let natts = (*tupdesc).natts as usize;
    let (mut values, mut nulls) = (vec![pg_sys::Datum::from(0); natts], vec![false; natts]);
    let mut tuple =
        pg_sys::HeapTupleData { t_len: pgrx::varsize_any(header.cast()) as u32, t_data: header, ..Default::default() };
    pg_sys::heap_deform_tuple(&mut tuple, tupdesc, values.as_mut_ptr(), nulls.as_mut_ptr());
    pg_sys::DecrTupleDescRefCount(tupdesc);
    row.encode_row(&values, &nulls, encoded);
}

/// # Safety
/// `type_oid` is a type's OID.
unsafe fn encoding_of(type_oid: pg_sys::Oid) -> Encoding {
    // A domain's values are its base type's.
    let type_oid = pg_sys::getBaseType(type_oid);
    match type_oid {
        pg_sys::BOOLOID => Encoding::BigEndian(1),
        pg_sys::INT2OID => Encoding::BigEndian(2),
        pg_sys::INT4OID | pg_sys::OIDOID | pg_sys::DATEOID => Encoding::BigEndian(4),
        pg_sys::INT8OID | pg_sys::TIMEOID | pg_sys::TIMESTAMPOID | pg_sys::TIMESTAMPTZOID => Encoding::BigEndian(8),
        pg_sys::FLOAT4OID => Encoding::Float(4),
        pg_sys::FLOAT8OID => Encoding::Float(8),
        pg_sys::UUIDOID => Encoding::Uuid,
        pg_sys::TEXTOID | pg_sys::VARCHAROID | pg_sys::BPCHAROID => Encoding::Text,
        pg_sys::NUMERICOID => Encoding::Numeric,
        pg_sys::JSONBOID => Encoding::Jsonb,
        _ if pg_sys::type_is_rowtype(type_oid) && type_oid != pg_sys::RECORDOID => {
            let tupdesc = pg_sys::lookup_rowtype_tupdesc(type_oid, -1);
            let row = RowHasher::new(tupdesc, 0);
            pg_sys::DecrTupleDescRefCount(tupdesc);
            Encoding::Composite(row)
        }
        // (get_element_type() answers for true arrays only: not for name or point, fixed-size
        // types with an element type.)
        _ if pg_sys::get_element_type(type_oid) != pg_sys::InvalidOid => {
            let element_type = pg_sys::get_element_type(type_oid);
            let mut element = ArrayElement {
                type_oid: element_type,
                length: 0,
                by_value: false,
                align: 0,
                encoding: encoding_of(element_type),
            };
            pg_sys::get_typlenbyvalalign(element_type, &mut element.length, &mut element.by_value, &mut element.align);
            Encoding::Array(Box::new(element))
        }
        _ => {
            let mut send = pg_sys::InvalidOid;
            let mut varlena = false;
            pg_sys::getTypeBinaryOutputInfo(type_oid, &mut send, &mut varlena);
            let mut info = Box::new(pg_sys::FmgrInfo::default());
            pg_sys::fmgr_info_cxt(send, &mut *info, pg_sys::TopMemoryContext);
            Encoding::Send(info)
        }
    }
}
