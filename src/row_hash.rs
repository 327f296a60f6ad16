//! The row hash of backfill_checksum(), and the scan that sums it per key range.
//!
//! A row's hash is SipHash-2-4, with a key of 16 zero bytes, of its columns in column order
//! (dropped ones aside), each as a byte 0 when NULL, else a byte 1, its length as 4 bytes big
//! endian, and its binary send format (the format of COPY BINARY and of the wire protocol),
//! text in UTF-8. A range's checksum is the exact sum of its rows' hashes read as signed 64-bit
//! integers: the same rows give the same sum in any order, and a duplicate row changes it.
//! Send formats do not depend on TimeZone, DateStyle or extra_float_digits, nor on the
//! architecture: identical rows give identical checksums on every server.
//!
//! The common fixed-size types and text are written here as their send functions write them,
//! without calling them (a call allocates its result); every other type calls its send function.

use crate::errors::raise;
use pgrx::prelude::*;
use pgrx::AnyElement;
use pgrx::PgSqlErrorCode::*;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_int, CString};
use std::hash::Hasher;

/// How one column's value enters its row's hash: its send format.
enum Encoding {
    /// A by-value integer (or the bits of a float) of this many bytes, big endian: int2, int4,
    /// int8, oid, date, time, timestamp, timestamptz, float4, float8, bool.
    BigEndian(usize),
    /// uuid: its 16 bytes.
    Uuid,
    /// text, varchar, bpchar: the characters in UTF-8.
    Text,
    /// Anything else: its type's send function.
    Send(Box<pg_sys::FmgrInfo>),
}

/// Hashes rows of one row type.
pub struct RowHasher {
    /// One per column, None for a dropped one.
    encodings: Vec<Option<Encoding>>,
}

impl RowHasher {
    /// For rows of `tupdesc`, from its column `first` on.
    ///
    /// # Safety
    /// `tupdesc` is a valid tuple descriptor.
    pub unsafe fn new(tupdesc: pg_sys::TupleDesc, first: usize) -> Self {
        let natts = (*tupdesc).natts as usize;
        let attributes = (*tupdesc).attrs.as_slice(natts);
        let encodings =
            attributes[first..].iter().map(|att| (!att.attisdropped).then(|| encoding_of(att.atttypid))).collect();
        RowHasher { encodings }
    }

    /// The hash of one row's values (those from the descriptor's column `first` on).
    ///
    /// # Safety
    /// The values are of the descriptor's types; a non-null one is a valid datum.
    pub unsafe fn hash(&mut self, values: &[pg_sys::Datum], nulls: &[bool]) -> u64 {
        #[allow(deprecated)] // SipHash-2-4, as documented: std's SipHasher is exactly that.
        let mut hasher = std::hash::SipHasher::new_with_keys(0, 0);
        for ((encoding, value), null) in self.encodings.iter_mut().zip(values).zip(nulls) {
            let Some(encoding) = encoding else { continue };
            if *null {
                hasher.write(&[0]);
                continue;
            }
            let mut field = |bytes: &[u8]| {
                hasher.write(&[1]);
                hasher.write(&(bytes.len() as u32).to_be_bytes());
                hasher.write(bytes);
            };
            match encoding {
                Encoding::BigEndian(size) => field(&value.value().to_be_bytes()[8 - *size..]),
                Encoding::Uuid => field(std::slice::from_raw_parts(value.cast_mut_ptr::<u8>(), 16)),
                Encoding::Text => {
                    let bytes = crate::encoding::text_of(*value);
                    field(&crate::encoding::to_utf8(bytes).unwrap_or(std::borrow::Cow::Borrowed(bytes)))
                }
                Encoding::Send(send) => {
                    let sent = pg_sys::SendFunctionCall(&mut **send, *value);
                    field(pgrx::varlena::varlena_to_byte_slice(sent));
                    pg_sys::pfree(sent.cast());
                }
            }
        }
        hasher.finish()
    }
}

/// # Safety
/// `type_oid` is a type's OID.
unsafe fn encoding_of(type_oid: pg_sys::Oid) -> Encoding {
    match type_oid {
        pg_sys::BOOLOID => Encoding::BigEndian(1),
        pg_sys::INT2OID => Encoding::BigEndian(2),
        pg_sys::INT4OID | pg_sys::OIDOID | pg_sys::DATEOID | pg_sys::FLOAT4OID => Encoding::BigEndian(4),
        pg_sys::INT8OID | pg_sys::TIMEOID | pg_sys::TIMESTAMPOID | pg_sys::TIMESTAMPTZOID | pg_sys::FLOAT8OID => {
            Encoding::BigEndian(8)
        }
        pg_sys::UUIDOID => Encoding::Uuid,
        pg_sys::TEXTOID | pg_sys::VARCHAROID | pg_sys::BPCHAROID => Encoding::Text,
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

thread_local! {
    /// The hasher of each row type hashed by backfill.row_hash() in this process.
    static HASHERS: RefCell<HashMap<pg_sys::Oid, RowHasher>> = RefCell::new(HashMap::new());
}

/// backfill.row_hash(t): the row's 64-bit hash, as backfill_checksum() sums it; a row of a
/// table, as `t` names it in `FROM tbl t`. (Text is taken in UTF-8 here too.)
#[pg_extern(schema = "backfill", immutable, parallel_safe)]
fn row_hash(row: AnyElement) -> i64 {
    // SAFETY: `row` is a composite datum (anything else is refused before it is read as one);
    // it is detoasted, deformed with its own type's descriptor, whose reference is released.
    unsafe {
        if !pg_sys::type_is_rowtype(row.oid()) {
            raise(
                ERRCODE_DATATYPE_MISMATCH,
                "backfill.row_hash() takes a table's row",
                "It hashes the columns of a row, as FROM tbl t SELECT backfill.row_hash(t) gives it.",
                None,
            );
        }
        let header = pg_sys::pg_detoast_datum(row.datum().cast_mut_ptr()) as pg_sys::HeapTupleHeader;
        // The row's own type, as its header records it (HeapTupleHeaderGetTypeId/TypMod).
        let type_oid = (*header).t_choice.t_datum.datum_typeid;
        let tupdesc = pg_sys::lookup_rowtype_tupdesc(type_oid, (*header).t_choice.t_datum.datum_typmod);
        let natts = (*tupdesc).natts as usize;
        let mut tuple = pg_sys::HeapTupleData {
            t_len: pgrx::varsize_any(header.cast()) as u32,
            t_data: header,
            ..Default::default()
        };
        let mut values = vec![pg_sys::Datum::from(0); natts];
        let mut nulls = vec![false; natts];
        pg_sys::heap_deform_tuple(&mut tuple, tupdesc, values.as_mut_ptr(), nulls.as_mut_ptr());
        let hash = HASHERS.with(|hashers| {
            let mut hashers = hashers.borrow_mut();
            let hasher = hashers.entry(type_oid).or_insert_with(|| RowHasher::new(tupdesc, 0));
            hasher.hash(&values, &nulls)
        });
        pg_sys::DecrTupleDescRefCount(tupdesc);
        hash as i64
    }
}

/// Each range's row count and the sum of its rows' hashes.
pub struct RangeSums {
    pub rows: Vec<i64>,
    pub sums: Vec<i128>,
    hash: bool,
    hasher: Option<RowHasher>,
}

/// A DestReceiver (first, so that PostgreSQL can use a pointer to this as one) and our sums.
#[repr(C)]
struct Receiver {
    base: pg_sys::DestReceiver,
    sums: *mut RangeSums,
}

/// Runs `sql` (its first column the range, 0 to `ranges - 1`; the table's columns after it,
/// when `hash`), with one jsonb parameter, and sums what it returns per range. The query may
/// run in parallel; the rows are hashed here as they come, with no row materialized twice.
pub fn scan(sql: &str, parameter: pgrx::JsonB, ranges: usize, hash: bool) -> RangeSums {
    let mut sums = RangeSums { rows: vec![0; ranges], sums: vec![0; ranges], hash, hasher: None };
    let text = CString::new(sql).expect("no NUL in SQL");
    // SAFETY: SPI is connected around the plan and its one execution; the receiver and the sums
    // it points to outlive the execution, which calls back into them only.
    unsafe {
        pg_sys::SPI_connect();
        let mut types = [pg_sys::JSONBOID];
        let plan =
            pg_sys::SPI_prepare_cursor(text.as_ptr(), 1, types.as_mut_ptr(), pg_sys::CURSOR_OPT_PARALLEL_OK as c_int);
        if plan.is_null() {
            let code = pg_sys::SPI_result;
            error!("could not plan the checksum's scan: SPI code {code}");
        }
        let params = pg_sys::makeParamList(1);
        let slot = &mut (*params).params.as_mut_slice(1)[0];
        slot.value = parameter.into_datum().unwrap_or(pg_sys::Datum::from(0));
        slot.isnull = false;
        slot.pflags = pg_sys::PARAM_FLAG_CONST as u16;
        slot.ptype = pg_sys::JSONBOID;
        let mut receiver = Receiver {
            base: pg_sys::DestReceiver {
                receiveSlot: Some(receive),
                rStartup: Some(startup),
                rShutdown: Some(shutdown),
                rDestroy: Some(shutdown),
                mydest: pg_sys::CommandDest::DestNone,
            },
            sums: &mut sums,
        };
        let options =
            pg_sys::SPIExecuteOptions { params, read_only: true, dest: &mut receiver.base, ..Default::default() };
        let rc = pg_sys::SPI_execute_plan_extended(plan, &options);
        pg_sys::SPI_finish();
        if rc < 0 {
            error!("the checksum's scan failed: SPI code {rc}");
        }
    }
    sums
}

#[pg_guard]
unsafe extern "C-unwind" fn startup(
    receiver: *mut pg_sys::DestReceiver,
    _operation: c_int,
    typeinfo: pg_sys::TupleDesc,
) {
    let sums = &mut *(*receiver.cast::<Receiver>()).sums;
    if sums.hash {
        sums.hasher = Some(RowHasher::new(typeinfo, 1));
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn receive(slot: *mut pg_sys::TupleTableSlot, receiver: *mut pg_sys::DestReceiver) -> bool {
    let sums = &mut *(*receiver.cast::<Receiver>()).sums;
    let natts = (*(*slot).tts_tupleDescriptor).natts;
    if ((*slot).tts_nvalid as c_int) < natts {
        pg_sys::slot_getsomeattrs_int(slot, natts);
    }
    let values = std::slice::from_raw_parts((*slot).tts_values, natts as usize);
    let nulls = std::slice::from_raw_parts((*slot).tts_isnull, natts as usize);
    // (width_bucket() of a key, which is never NULL, within the bounds given.)
    let range = (values[0].value() as i32).clamp(0, sums.rows.len() as i32 - 1) as usize;
    sums.rows[range] += 1;
    if let Some(hasher) = &mut sums.hasher {
        sums.sums[range] += i128::from(hasher.hash(&values[1..], &nulls[1..]) as i64);
    }
    true
}

#[pg_guard]
unsafe extern "C-unwind" fn shutdown(_receiver: *mut pg_sys::DestReceiver) {}
