// A real pgoutput client for pg_backfill's end-to-end test (test_node_consumer.py): it streams a
// slot with pg-logical-replication's PgoutputPlugin (messages: true) and builds a copy of one
// table from the stream alone, applying the table's changes and pg_backfill's messages (read,
// reads, absent) in stream order, checking every message's tag with the message keys given.
// When it meets a transactional message with prefix "test_end" it prints the copy (one JSON
// row per line, after a line of counts) and exits.
//
// node consumer.js PORT DBNAME SLOT PUBLICATION TABLE KEYS_JSON   (KEYS_JSON: {"<id>": "<hex>"})
'use strict';
const crypto = require('node:crypto');
const { LogicalReplicationService, PgoutputPlugin } = require('pg-logical-replication');

const [port, database, slot, publication, table, keysJson] = process.argv.slice(2);
const keys = Object.fromEntries(Object.entries(JSON.parse(keysJson)).map(([id, hex]) => [id, Buffer.from(hex, 'hex')]));
const copy = new Map(); // key (the id, as text) -> row {column: value as text}
const counts = { messages: 0, reads: 0, batches: 0, rowsInBatches: 0, absent: 0, changes: 0, invalid: 0 };
let xid = null;

// The check of docs/consumers.md: HMAC-SHA256 over "<xid>:" and the message without its auth field.
function genuine(content, xid) {
  const at = content.lastIndexOf(Buffer.from(',"auth":"'));
  if (at < 0 || !content.subarray(-2).equals(Buffer.from('"}'))) return false;
  const [keyId, tag] = content.subarray(at + 9, -2).toString().split(':');
  const key = keys[keyId];
  if (!key) return false;
  const mac = crypto.createHmac('sha256', key);
  mac.update(`${xid >>> 0}:`);
  mac.update(content.subarray(0, at));
  mac.update('}');
  return crypto.timingSafeEqual(Buffer.from(mac.digest('hex')), Buffer.from(tag));
}

const asText = (row) => Object.fromEntries(Object.entries(row).map(([k, v]) => [k, v === null ? null : String(v)]));
const upsert = (row) => copy.set(String(row.id), asText(row));

function applyBackfill(message) {
  if (message.table !== table) return;
  if (message.op === 'read') {
    counts.reads += 1;
    upsert(message.data);
  } else if (message.op === 'reads') {
    counts.batches += 1;
    for (const row of message.rows) {
      counts.rowsInBatches += 1;
      upsert(row.data);
    }
  } else if (message.op === 'absent') {
    counts.absent += 1;
    copy.delete(String(message.key.id));
  }
}

const service = new LogicalReplicationService(
  { host: '127.0.0.1', port: Number(port), user: 'postgres', database },
  { acknowledge: { auto: true, timeoutSeconds: 1 } },
);
const plugin = new PgoutputPlugin({ protoVersion: 1, publicationNames: [publication], messages: true });

service.on('data', async (lsn, log) => {
  switch (log.tag) {
    case 'begin':
      xid = log.xid;
      break;
    case 'insert':
      if (log.relation.name === table) { counts.changes += 1; upsert(log.new); }
      break;
    case 'update':
      if (log.relation.name === table) {
        counts.changes += 1;
        const old = log.key || log.old;
        if (old && String(old.id) !== String(log.new.id)) copy.delete(String(old.id));
        upsert(log.new);
      }
      break;
    case 'delete':
      if (log.relation.name === table) { counts.changes += 1; copy.delete(String((log.key || log.old).id)); }
      break;
    case 'message':
      if (log.prefix === 'backfill') {
        counts.messages += 1;
        if (!genuine(log.content, xid)) counts.invalid += 1;
        applyBackfill(JSON.parse(log.content.toString('utf8')));
      } else if (log.prefix === 'test_end') {
        await service.acknowledge(lsn);
        await service.stop();
        const lines = [counts, ...copy.values()].map((row) => JSON.stringify(row) + '\n');
        // (Exit once written: writes to a pipe are asynchronous, and an exit would cut them short.)
        process.stdout.write(lines.join(''), () => process.exit(0));
      }
      break;
  }
});
service.on('error', (err) => { console.error(err); process.exit(2); });
service.subscribe(plugin, slot).catch((err) => { console.error(err); process.exit(3); });
