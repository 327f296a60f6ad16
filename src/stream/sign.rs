//! Authenticated messages: a consumer can tell a genuine message from a forged or replayed one.
//!
//! Any role that may call `pg_logical_emit_message` can write a message with pg_backfill's
//! prefix into every consumer's stream. So every message ends with a tag:
//!
//! ```text
//! {...,"commit_lsn":"0/0","auth":"<key id>:<64 hex digits>"}
//! ```
//!
//! The tag is HMAC-SHA256, keyed with the database's message key (`backfill.message_key`, which
//! only the extension's owner and the roles it grants can read; its bytes are kept in sequences,
//! out of every decoded stream: see sql/catalog.sql), over `<xid>:` followed by the
//! message without its `auth` field (the same bytes up to `,"auth":"`, then `}`). `<xid>` is the
//! decimal id of the transaction that carries the message, which every decoder reports with the
//! transaction (pgoutput's BEGIN, test_decoding's `BEGIN <xid>`, wal2json's `xid`): a genuine
//! message copied into another transaction no longer verifies.
//!
//! Keys are kept after a rotation, so messages written before it still verify by their key id.

use crate::pg::errors::OrInternal;
use hmac::{Hmac, Mac};
use pgrx::prelude::*;
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// What precedes the tag in a message.
const AUTH_FIELD: &[u8] = b",\"auth\":\"";

/// Bytes a seal adds to a message signed with a key of a one-digit id (the estimate's figure).
pub const SEAL_LEN: usize = AUTH_FIELD.len() + "1:".len() + 64 + "\"}".len() - "}".len();

/// The most bytes a seal adds: a key id has at most the 10 digits of an i32 (and no sign: ids
/// are an identity from 1). What a message's size bound reserves before it is sealed.
pub const MAX_SEAL_LEN: usize = SEAL_LEN - 1 + 10;

/// Signs the messages of one transaction.
pub struct Signer {
    /// The key's id and the MAC keyed with it once (cloned per message: a copy of two hash
    /// states, not a rekeying). None while the database's extension is still at 0.1.0, which
    /// had no key: its messages go unsigned, as 0.1.0 wrote them, until ALTER EXTENSION UPDATE.
    key: Option<(i32, HmacSha256)>,
    /// `<xid>:`, what every tag of the transaction starts with.
    xid_prefix: Vec<u8>,
}

impl Signer {
    /// The signer of the current transaction's messages, with `key` (its id and bytes): the
    /// database's current message key, which the worker reads and hands in (catalog/job.rs's
    /// `signing_key`). Assigns the transaction its id, which its first message would do anyway.
    pub fn for_this_transaction(key: Option<(i32, Vec<u8>)>) -> Self {
        // SAFETY: assigns (or returns) the top-level transaction id; the worker is in a
        // transaction, never in recovery.
        let xid = unsafe { pg_sys::GetTopTransactionId() };
        Signer { key: key.map(|(id, key)| (id, keyed(&key))), xid_prefix: format!("{}:", u32::from(xid)).into_bytes() }
    }

    /// Appends the tag to a message: `message` is a complete JSON object, whose closing brace
    /// is replaced by `,"auth":"..."}`.
    pub fn seal(&self, message: &mut Vec<u8>) {
        let Some((key_id, keyed)) = &self.key else { return };
        let mut mac = keyed.clone();
        mac.update(&self.xid_prefix);
        mac.update(message);
        message.pop();
        message.extend_from_slice(AUTH_FIELD);
        message.extend_from_slice(itoa::Buffer::new().format(*key_id).as_bytes());
        message.push(b':');
        push_hex(message, &mac.finalize().into_bytes());
        message.extend_from_slice(b"\"}");
    }
}

fn keyed(key: &[u8]) -> HmacSha256 {
    HmacSha256::new_from_slice(key).expect("HMAC takes a key of any length")
}

fn push_hex(out: &mut Vec<u8>, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for byte in bytes {
        out.push(DIGITS[usize::from(byte >> 4)]);
        out.push(DIGITS[usize::from(byte & 0x0f)]);
    }
}

/// A message split into what its tag covers and the tag: (body without the closing brace, key
/// id, tag bytes). None when it has no well-formed tag.
fn split(content: &[u8]) -> Option<(&[u8], i32, Vec<u8>)> {
    let at = content.windows(AUTH_FIELD.len()).rposition(|w| w == AUTH_FIELD)?;
    let tag = content[at + AUTH_FIELD.len()..].strip_suffix(b"\"}")?;
    let colon = tag.iter().position(|&b| b == b':')?;
    let key_id = std::str::from_utf8(&tag[..colon]).ok()?.parse::<i32>().ok()?;
    let hex = &tag[colon + 1..];
    if hex.len() != 64 {
        return None;
    }
    let digest = hex
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    Some((&content[..at], key_id, digest))
}

/// Whether `content` is a message that pg_backfill wrote in transaction `xid`, as a consumer
/// checks it. Reads the key as the caller: a role not granted the key gets 42501.
pub fn verify(content: &[u8], xid: i64) -> bool {
    let Ok(xid) = u32::try_from(xid) else { return false };
    let Some((body, key_id, digest)) = split(content) else { return false };
    let key = Spi::connect(|client| {
        let rows = client.select(
            "SELECT key FROM backfill.message_key WHERE id OPERATOR(pg_catalog.=) $1",
            Some(1),
            &[key_id.into()],
        )?;
        if rows.is_empty() {
            return Ok(None);
        }
        rows.first().get::<Vec<u8>>(1)
    })
    .or_internal("read the message key");
    let Some(key) = key else { return false };
    let mut mac = keyed(&key);
    mac.update(format!("{xid}:").as_bytes());
    mac.update(body);
    mac.update(b"}");
    mac.verify_slice(&digest).is_ok()
}

/// backfill_message_valid(): whether a message is genuine, checked as a consumer checks it.
#[pg_extern(name = "backfill_message_valid", stable)]
fn message_valid(content: Option<crate::pg::encoding::Text>, xid: Option<i64>) -> bool {
    // Text: the message in UTF-8, the bytes its tag covers, whatever the database's encoding.
    let content = content.map(|t| t.0);
    let content = content.as_deref();
    let (Some(content), Some(xid)) = (content, xid) else {
        let argument = if content.is_none() { "content" } else { "xid" };
        crate::pg::errors::raise(
            pgrx::PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
            format!("argument {argument} of backfill_message_valid must not be NULL"),
            "A message is checked against the id of the transaction that carried it.",
            Some("Pass the message's content and the xid its decoder reported with the transaction.".into()),
        )
    };
    verify(content.as_bytes(), xid)
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use super::*;

    #[pg_test]
    fn a_sealed_message_verifies_only_unchanged_and_in_its_own_transaction() {
        let signer = Signer::for_this_transaction(crate::catalog::job::signing_key());
        // SAFETY: the transaction's id, assigned by the signer above.
        let xid = i64::from(u32::from(unsafe { pg_sys::GetTopTransactionId() }));
        let mut message = br#"{"op":"read","data":{"id":1}}"#.to_vec();
        signer.seal(&mut message);
        assert!(message.starts_with(br#"{"op":"read","data":{"id":1},"auth":""#));
        assert!(verify(&message, xid));
        assert!(!verify(&message, xid + 1), "replayed in another transaction");
        let mut tampered = message.clone();
        tampered[20] = b'2';
        assert!(!verify(&tampered, xid), "tampered");
        assert!(!verify(&message[..message.len() - 1], xid), "truncated");
    }
}
