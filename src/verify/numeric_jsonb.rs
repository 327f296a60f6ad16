//! The encodings of row_hash.rs that are read from a value's stored form rather than asked of
//! its type's send function: numeric (its send format, without the allocation) and jsonb (the
//! tokens of a walk of the document; its send format is its text).

use crate::pg::errors::raise;
use pgrx::prelude::*;
use pgrx::varlena::{vardata_any, varsize_any_exhdr};
use pgrx::PgSqlErrorCode::*;

/// Appends numeric's send format, as numeric_send() writes it (its digit count, weight, sign
/// and display scale, then its base-10000 digits, each 2 bytes big endian), read from the
/// value as numeric.c stores it (src/backend/utils/adt/numeric.c: a short or a long header, or
/// a special value's), without calling numeric_send(), which allocates.
///
/// # Safety
/// `numeric` is a detoasted numeric varlena (with a 1- or 4-byte header).
pub unsafe fn encode_numeric(numeric: *const pg_sys::varlena, out: &mut Vec<u8>) {
    const SIGN_MASK: u16 = 0xC000;
    const SHORT: u16 = 0x8000;
    const SPECIAL: u16 = 0xC000;
    const EXT_SIGN_MASK: u16 = 0xF000;
    const SHORT_SIGN_MASK: u16 = 0x2000;
    const NEG: u16 = 0x4000;
    const SHORT_DSCALE_MASK: u16 = 0x1F80;
    const SHORT_WEIGHT_SIGN_MASK: u16 = 0x0040;
    const SHORT_WEIGHT_MASK: u16 = 0x003F;
    const DSCALE_MASK: u16 = 0x3FFF;
    let data = vardata_any(numeric).cast::<u8>();
    let size = varsize_any_exhdr(numeric);
    // (Words in the machine's order; a value in a tuple is not always 2-byte aligned.)
    let word = |i: usize| u16::from_ne_bytes([*data.add(2 * i), *data.add(2 * i + 1)]);
    let header = word(0);
    // A special value has a short header's size.
    let short_header = header & SHORT != 0;
    let (weight, dscale, first_digit) = if short_header {
        let weight =
            (header & SHORT_WEIGHT_MASK) | if header & SHORT_WEIGHT_SIGN_MASK != 0 { !SHORT_WEIGHT_MASK } else { 0 };
        (weight, (header & SHORT_DSCALE_MASK) >> 7, 1)
    } else {
        (word(1), header & DSCALE_MASK, 2)
    };
    let sign = match header & SIGN_MASK {
        SHORT if header & SHORT_SIGN_MASK != 0 => NEG,
        SHORT => 0,
        SPECIAL => header & EXT_SIGN_MASK,
        sign => sign,
    };
    let digits = size / 2 - first_digit;
    for field in [digits as u16, weight, sign, dscale] {
        out.extend_from_slice(&field.to_be_bytes());
    }
    for i in first_digit..first_digit + digits {
        out.extend_from_slice(&word(i).to_be_bytes());
    }
}

/// Appends a jsonb document's encoding: the tokens of a walk of it, in the order jsonb keeps it
/// (an object's keys shorter first, then bytewise, as on every server): `{` and `}` around an
/// object, `[` and `]` around an array (`s` and `]` around a scalar document), a key as `k`, a
/// string as `"`, each followed by its length (4 bytes, big endian) and its UTF-8; a number as
/// `#`, its length and numeric's send format; `t`, `f` and `n` for true, false and null. (Its
/// send format, a version byte and the text, costs a text conversion of every number.)
///
/// # Safety
/// `value` is a jsonb datum. What it allocates is left to the current memory context.
pub unsafe fn encode_jsonb(value: pg_sys::Datum, out: &mut Vec<u8>) {
    // (Detoasted, and with a 4-byte header: the document is then 4-byte aligned, as its words.)
    let jsonb = pg_sys::pg_detoast_datum(value.cast_mut_ptr()).cast::<u8>();
    encode_container(jsonb.add(pg_sys::VARHDRSZ), out);
}

/// The bits of a container's header word and of its children's entry words, as jsonb stores
/// them on disk in every version (src/include/utils/jsonb.h).
const JB_CMASK: u32 = 0x0FFF_FFFF;
const JB_FSCALAR: u32 = 0x1000_0000;
const JB_FOBJECT: u32 = 0x2000_0000;
const JENTRY_OFFLENMASK: u32 = 0x0FFF_FFFF;
const JENTRY_TYPEMASK: u32 = 0x7000_0000;
const JENTRY_HAS_OFF: u32 = 0x8000_0000;

/// One container of a jsonb document: its header word (the count of its elements or pairs, and
/// its kind), one entry word per child (an object's keys first, then their values), then the
/// children's data. An entry gives its child's type and the length of its data or, every 32nd,
/// the end of it. Read as it lies, with no copy and no allocation but numbers' send formats.
///
/// # Safety
/// `container` is a jsonb container, 4-byte aligned.
unsafe fn encode_container(container: *const u8, out: &mut Vec<u8>) {
    pg_sys::check_stack_depth();
    let word = |at: *const u8| at.cast::<u32>().read();
    let header = word(container);
    let count = (header & JB_CMASK) as usize;
    let is_object = header & JB_FOBJECT != 0;
    let entries = container.add(4);
    let data = entries.add(4 * if is_object { 2 * count } else { count });
    let entry = |child: usize| word(entries.add(4 * child));
    // Where child `child`'s data ends, given where it starts.
    let end_of = |child: usize, start: usize| {
        let entry = entry(child);
        let offset_or_length = (entry & JENTRY_OFFLENMASK) as usize;
        if entry & JENTRY_HAS_OFF != 0 {
            offset_or_length
        } else {
            start + offset_or_length
        }
    };
    if is_object {
        out.push(b'{');
        // The values' data follows the keys'.
        let mut value_start = 0;
        for key in 0..count {
            value_start = end_of(key, value_start);
        }
        let mut key_start = 0;
        for key in 0..count {
            let key_end = end_of(key, key_start);
            let bytes = std::slice::from_raw_parts(data.add(key_start), key_end - key_start);
            counted(out, b'k', &utf8(bytes));
            let value_end = end_of(count + key, value_start);
            encode_child(entry(count + key), data, value_start, value_end, out);
            (key_start, value_start) = (key_end, value_end);
        }
        out.push(b'}');
    } else {
        out.push(if header & JB_FSCALAR != 0 { b's' } else { b'[' });
        let mut start = 0;
        for element in 0..count {
            let end = end_of(element, start);
            encode_child(entry(element), data, start, end, out);
            start = end;
        }
        out.push(b']');
    }
}

/// One child of a container, its data from `start` to `end` of the container's data. (A number
/// or a container begins at the next multiple of 4.)
///
/// # Safety
/// As [`encode_container`]; `entry`, `start` and `end` are a child's of the container.
unsafe fn encode_child(entry: u32, data: *const u8, start: usize, end: usize, out: &mut Vec<u8>) {
    let aligned = data.add((start + 3) & !3);
    match entry & JENTRY_TYPEMASK {
        0x0000_0000 => {
            let bytes = std::slice::from_raw_parts(data.add(start), end - start);
            counted(out, b'"', &utf8(bytes))
        }
        0x1000_0000 => length_prefixed(out, b'#', |out| encode_numeric(aligned.cast(), out)),
        0x2000_0000 => out.push(b'f'),
        0x3000_0000 => out.push(b't'),
        0x4000_0000 => out.push(b'n'),
        0x5000_0000 => encode_container(aligned, out),
        other => raise(
            ERRCODE_DATA_CORRUPTED,
            format!("jsonb entry of unknown type {other:#x}"),
            "A jsonb value's data is not in the format PostgreSQL writes.",
            Some(crate::pg::errors::BUG_HINT.into()),
        ),
    }
}

/// A tag, the length of `bytes` (4 bytes, big endian), `bytes`.
fn counted(out: &mut Vec<u8>, tag: u8, bytes: &[u8]) {
    length_prefixed(out, tag, |out| out.extend_from_slice(bytes));
}

/// A tag, the length of what `write` appends (4 bytes, big endian, written once it has), and it.
pub fn length_prefixed(out: &mut Vec<u8>, tag: u8, write: impl FnOnce(&mut Vec<u8>)) {
    out.push(tag);
    let length_at = out.len();
    out.extend_from_slice(&[0; 4]);
    write(out);
    let length = (out.len() - length_at - 4) as u32;
    out[length_at..length_at + 4].copy_from_slice(&length.to_be_bytes());
}

/// Text in the database's encoding, in UTF-8 (as it is when it has no UTF-8 form: the hash is
/// then of its bytes).
pub fn utf8(bytes: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    crate::pg::encoding::to_utf8(bytes).unwrap_or(std::borrow::Cow::Borrowed(bytes))
}
