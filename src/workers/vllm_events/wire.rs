//! vLLM's KV-event payload (`vllm/distributed/kv_events.py`, a msgspec msgpack `KVEventBatch`)
//! read from a decoded tree into checked events.
//!
//! Both wire shapes vLLM has used are accepted, because a gateway meets several vLLM versions:
//! - up to v0.2x: the batch `[ts, events, data_parallel_rank]` and each event a tagged array,
//!   `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
//!   lora_name, extra_keys, group_idx, …]`, `["BlockRemoved", block_hashes, medium, group_idx]`,
//!   `["AllBlocksCleared"]` (field order as in vLLM's `BlockStored` class at v0.11–v0.26);
//! - later: events (and, on main, the batch too) as maps with a `type` tag and named fields.
//!
//! Fields past the ones read are ignored (newer versions append them), and so are trailing
//! optional fields that are absent (msgspec omits defaults). Event types not known here are
//! skipped. Block hashes are 64-bit ints (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`, or Python's
//! `hash()`, which may be negative) or byte strings (sha256 digests), folded to 64 bits.

use xxhash_rust::xxh3::xxh3_64;

use super::msgpack::Value;

/// Most block hashes in one event (a 64k-token prompt in 16-token blocks).
pub const MAX_HASHES_PER_EVENT: usize = 4096;
/// Largest block size accepted, tokens (vLLM uses 16 to 256).
pub const MAX_BLOCK_SIZE: usize = 1024;
/// Longest byte-string block hash accepted (sha256 is 32).
const MAX_HASH_BYTES: usize = 64;
/// Most events in one batch.
pub const MAX_EVENTS_PER_BATCH: usize = 4096;

/// One KV-cache event the index can use.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Full blocks became cached: `hashes[i]` holds `token_ids[i×block_size..(i+1)×block_size]`,
    /// chained after `parent` (`None`: the first block of a prompt).
    Stored {
        /// vLLM's hashes of the blocks, in order.
        hashes: Vec<u64>,
        /// The block before the first one.
        parent: Option<u64>,
        /// Their tokens, `hashes.len() × block_size` of them.
        token_ids: Vec<u32>,
        /// Tokens per block.
        block_size: usize,
    },
    /// Blocks left the cache.
    Removed(Vec<u64>),
    /// The whole cache was cleared (a reset).
    Cleared,
    /// An event that does not concern the GPU prefix cache of the base model (a LoRA adapter's
    /// blocks, another medium such as CPU offload, another KV group), or of a type added later.
    Skipped,
}

/// Why a payload does not read as a batch (the counter's `reason="schema"`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaError(pub String);

fn bad<T>(what: impl Into<String>) -> Result<T, SchemaError> {
    Err(SchemaError(what.into()))
}

/// The events of one batch, in order.
pub fn batch(v: &Value<'_>) -> Result<Vec<Event>, SchemaError> {
    let events = match v {
        Value::Array(items) if items.len() >= 2 => &items[1],
        Value::Map(_) => match v.get("events") {
            Some(e) => e,
            None => return bad("batch map without `events`"),
        },
        _ => return bad("batch is neither [ts, events, ...] nor a map"),
    };
    let Value::Array(events) = events else {
        return bad("`events` is not an array");
    };
    if events.len() > MAX_EVENTS_PER_BATCH {
        return bad(format!("{} events in one batch", events.len()));
    }
    events.iter().map(event).collect()
}

/// Field `name` at array position `pos` (tag at 0), or by name in a map; `None` when absent.
fn field<'v, 'a>(ev: &'v Value<'a>, pos: usize, name: &str) -> Option<&'v Value<'a>> {
    match ev {
        Value::Array(items) => items.get(pos),
        _ => ev.get(name),
    }
}

fn event(ev: &Value<'_>) -> Result<Event, SchemaError> {
    let tag = match ev {
        Value::Array(items) => items.first(),
        Value::Map(_) => ev.get("type"),
        _ => return bad("an event is neither a tagged array nor a map"),
    };
    let Some(Value::Str(tag)) = tag else {
        return bad("an event without a string tag");
    };
    match *tag {
        "BlockStored" => stored(ev),
        "BlockRemoved" => {
            let hashes = hashes(field(ev, 1, "block_hashes"))?;
            if foreign(ev, None, Some((2, "medium")), 3) {
                return Ok(Event::Skipped);
            }
            Ok(Event::Removed(hashes))
        }
        "AllBlocksCleared" => Ok(Event::Cleared),
        _ => Ok(Event::Skipped),
    }
}

fn stored(ev: &Value<'_>) -> Result<Event, SchemaError> {
    let hashes = hashes(field(ev, 1, "block_hashes"))?;
    let parent = match field(ev, 2, "parent_block_hash") {
        None | Some(Value::Nil) => None,
        Some(h) => Some(hash(h)?),
    };
    let block_size = match field(ev, 4, "block_size") {
        Some(Value::Uint(n)) if (1..=MAX_BLOCK_SIZE as u64).contains(n) => *n as usize,
        _ => return bad(format!("block_size is not 1..={MAX_BLOCK_SIZE}")),
    };
    let Some(Value::Array(tokens)) = field(ev, 3, "token_ids") else {
        return bad("token_ids is not an array");
    };
    // vLLM sends the tokens of exactly the blocks stored.
    if tokens.len() != hashes.len() * block_size {
        return bad(format!(
            "{} token_ids for {} blocks of {block_size}",
            tokens.len(),
            hashes.len()
        ));
    }
    let token_ids = tokens
        .iter()
        .map(|t| match t {
            Value::Uint(n) => u32::try_from(*n).map_err(|_| SchemaError("token id > u32".into())),
            _ => bad("a token id is not an unsigned int"),
        })
        .collect::<Result<Vec<_>, _>>()?;
    if foreign(ev, Some((5, "lora_id")), Some((6, "medium")), 9)
        || field(ev, 7, "lora_name").is_some_and(|v| *v != Value::Nil)
    {
        return Ok(Event::Skipped);
    }
    Ok(Event::Stored {
        hashes,
        parent,
        token_ids,
        block_size,
    })
}

/// Whether the event concerns another cache than the base model's GPU prefix cache: a LoRA
/// id, a medium other than `GPU`, or a KV group other than the first.
fn foreign(
    ev: &Value<'_>,
    lora: Option<(usize, &str)>,
    medium: Option<(usize, &str)>,
    group_pos: usize,
) -> bool {
    let lora = lora
        .and_then(|(pos, name)| field(ev, pos, name))
        .is_some_and(|v| !matches!(v, Value::Nil | Value::Uint(0)));
    let medium = medium
        .and_then(|(pos, name)| field(ev, pos, name))
        .is_some_and(|v| !matches!(v, Value::Nil | Value::Str("GPU")));
    let group = field(ev, group_pos, "group_idx")
        .is_some_and(|v| !matches!(v, Value::Nil | Value::Uint(0)));
    lora || medium || group
}

fn hashes(v: Option<&Value<'_>>) -> Result<Vec<u64>, SchemaError> {
    let Some(Value::Array(items)) = v else {
        return bad("block_hashes is not an array");
    };
    if items.len() > MAX_HASHES_PER_EVENT {
        return bad(format!("{} block hashes in one event", items.len()));
    }
    items.iter().map(hash).collect()
}

fn hash(v: &Value<'_>) -> Result<u64, SchemaError> {
    match v {
        Value::Uint(n) => Ok(*n),
        Value::Int(n) => Ok(*n as u64),
        Value::Bin(b) if !b.is_empty() && b.len() <= MAX_HASH_BYTES => Ok(xxh3_64(b)),
        _ => bad("a block hash is neither an int nor a short byte string"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(x: &str) -> Value<'_> {
        Value::Str(x)
    }

    fn uints(xs: &[u64]) -> Value<'static> {
        Value::Array(xs.iter().map(|&x| Value::Uint(x)).collect())
    }

    fn stored_array(extra: Vec<Value<'static>>) -> Value<'static> {
        let mut v = vec![
            s("BlockStored"),
            uints(&[11, 12]),
            Value::Nil,
            uints(&[1, 2, 3, 4]),
            Value::Uint(2),
        ];
        v.extend(extra);
        Value::Array(v)
    }

    fn want_stored() -> Event {
        Event::Stored {
            hashes: vec![11, 12],
            parent: None,
            token_ids: vec![1, 2, 3, 4],
            block_size: 2,
        }
    }

    #[test]
    fn legacy_arrays_with_or_without_trailing_fields() {
        let short = Value::Array(vec![
            Value::Float(1.5),
            Value::Array(vec![stored_array(vec![])]),
        ]);
        assert_eq!(batch(&short), Ok(vec![want_stored()]));
        // v0.26's order with fields appended by a later version.
        let long = stored_array(vec![
            Value::Nil,
            s("GPU"),
            Value::Nil,
            Value::Array(vec![Value::Nil, Value::Nil]),
            Value::Uint(0),
            s("full_attention"),
            s("something newer"),
        ]);
        let b = Value::Array(vec![
            Value::Float(1.5),
            Value::Array(vec![
                long,
                Value::Array(vec![s("BlockRemoved"), uints(&[12]), s("GPU")]),
                Value::Array(vec![s("AllBlocksCleared")]),
                Value::Array(vec![s("SomethingNew"), Value::Uint(1)]),
            ]),
            Value::Uint(0),
        ]);
        assert_eq!(
            batch(&b),
            Ok(vec![
                want_stored(),
                Event::Removed(vec![12]),
                Event::Cleared,
                Event::Skipped
            ])
        );
    }

    #[test]
    fn tagged_maps_and_a_map_batch() {
        let ev = Value::Map(vec![
            (s("type"), s("BlockStored")),
            (s("block_hashes"), uints(&[11, 12])),
            (s("parent_block_hash"), Value::Nil),
            (s("token_ids"), uints(&[1, 2, 3, 4])),
            (s("block_size"), Value::Uint(2)),
            (s("medium"), s("GPU")),
            (s("kv_cache_spec_kind"), s("full_attention")),
        ]);
        let b = Value::Map(vec![
            (s("ts"), Value::Float(1.0)),
            (s("events"), Value::Array(vec![ev])),
        ]);
        assert_eq!(batch(&b), Ok(vec![want_stored()]));
    }

    #[test]
    fn hashes_of_every_kind() {
        assert_eq!(hash(&Value::Int(-2)), Ok(u64::MAX - 1));
        assert_eq!(hash(&Value::Bin(&[7; 32])), Ok(xxh3_64(&[7; 32])));
        assert!(hash(&Value::Bin(&[7; 65])).is_err());
        assert!(hash(&Value::Str("x")).is_err());
    }

    #[test]
    fn other_caches_are_skipped() {
        for (pos, v) in [
            (5, Value::Uint(3)),
            (6, s("CPU")),
            (7, s("adapter")),
            (9, Value::Uint(1)),
        ] {
            let mut extra = vec![Value::Nil, s("GPU"), Value::Nil, Value::Nil, Value::Nil];
            extra[pos - 5] = v;
            let b = Value::Array(vec![
                Value::Float(0.0),
                Value::Array(vec![stored_array(extra)]),
            ]);
            assert_eq!(batch(&b), Ok(vec![Event::Skipped]), "field {pos}");
        }
    }

    #[test]
    fn malformed_events_are_refused() {
        let wrap =
            |ev: Value<'static>| Value::Array(vec![Value::Float(0.0), Value::Array(vec![ev])]);
        let mut wrong_count = stored_array(vec![]);
        if let Value::Array(items) = &mut wrong_count {
            items[3] = uints(&[1, 2, 3]);
        }
        let mut zero_block = stored_array(vec![]);
        if let Value::Array(items) = &mut zero_block {
            items[4] = Value::Uint(0);
        }
        let mut big_token = stored_array(vec![]);
        if let Value::Array(items) = &mut big_token {
            items[3] = uints(&[1, 2, 3, 1 << 40]);
        }
        let too_many = Value::Array(vec![
            s("BlockRemoved"),
            uints(&vec![1; MAX_HASHES_PER_EVENT + 1]),
        ]);
        for ev in [
            wrong_count,
            zero_block,
            big_token,
            too_many,
            Value::Uint(3),
            Value::Array(vec![Value::Uint(1)]),
            Value::Array(vec![s("BlockStored")]),
        ] {
            assert!(batch(&wrap(ev.clone())).is_err(), "{ev:?}");
        }
        assert!(batch(&Value::Uint(1)).is_err());
        assert!(batch(&Value::Array(vec![Value::Float(0.0), Value::Nil])).is_err());
    }
}
