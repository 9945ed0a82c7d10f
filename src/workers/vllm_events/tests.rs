use super::*;
use crate::routing::features::prefix_hashes;

/// A tiny msgpack writer for the tests (the publisher's side).
enum W {
    Nil,
    U(u64),
    F(f64),
    S(&'static str),
    A(Vec<W>),
}

fn enc(w: &W, out: &mut Vec<u8>) {
    match w {
        W::Nil => out.push(0xc0),
        W::U(n) => {
            out.push(0xcf);
            out.extend_from_slice(&n.to_be_bytes());
        }
        W::F(f) => {
            out.push(0xcb);
            out.extend_from_slice(&f.to_bits().to_be_bytes());
        }
        W::S(s) => {
            out.push(0xd9);
            out.push(s.len() as u8);
            out.extend_from_slice(s.as_bytes());
        }
        W::A(items) => {
            out.push(0xdd);
            out.extend_from_slice(&(items.len() as u32).to_be_bytes());
            for i in items {
                enc(i, out);
            }
        }
    }
}

fn payload(events: Vec<W>) -> Vec<u8> {
    let mut out = Vec::new();
    enc(&W::A(vec![W::F(1.0), W::A(events), W::U(0)]), &mut out);
    out
}

fn uints(xs: impl IntoIterator<Item = u64>) -> W {
    W::A(xs.into_iter().map(W::U).collect())
}

fn stored(parent: Option<u64>, hashes: &[u64], tokens: &[u32]) -> W {
    W::A(vec![
        W::S("BlockStored"),
        uints(hashes.iter().copied()),
        parent.map_or(W::Nil, W::U),
        uints(tokens.iter().map(|&t| u64::from(t))),
        W::U(16),
        W::Nil,
        W::S("GPU"),
    ])
}

fn removed(hashes: &[u64]) -> W {
    W::A(vec![
        W::S("BlockRemoved"),
        uints(hashes.iter().copied()),
        W::S("GPU"),
    ])
}

/// Byte-level vocabulary: id b < 256 is byte b.
fn vocab() -> Vocab {
    let entries: Vec<String> = (0..256).map(|b| format!("\"<0x{b:02X}>\":{b}")).collect();
    Vocab::from_tokenizer_json(&format!(
        r#"{{"model":{{"vocab":{{{}}}}}}}"#,
        entries.join(",")
    ))
    .unwrap()
}

fn message(seq: u64, events: Vec<W>) -> (u64, Vec<Event>) {
    let p = payload(events);
    let seq = seq.to_be_bytes();
    read_message(&[b"kv", &seq, &p], "kv").unwrap()
}

#[test]
fn malformed_messages_are_refused_by_reason() {
    let p = payload(vec![]);
    let seq = 0u64.to_be_bytes();
    assert!(read_message(&[b"kv", &seq, &p], "kv").is_ok());
    let cases: [(&[&[u8]], Reject); 6] = [
        (&[b"kv", &seq], Reject::Frames),
        (&[b"kv", &seq[..7], &p], Reject::Frames),
        (&[b"other", &seq, &p], Reject::Topic),
        (&[b"kv", &seq, &[0xc1, 0, 0]], Reject::Malformed),
        (&[b"kv", &seq, &[0x93, 1, 2, 3]], Reject::Schema),
        (&[b"kv", &seq, &p[..p.len() - 1]], Reject::Malformed),
    ];
    for (frames, want) in cases {
        assert_eq!(
            read_message(frames, "kv").map_err(|r| r.reason).map(|_| ()),
            Err(want)
        );
    }
    let huge = vec![0u8; MAX_MESSAGE_BYTES];
    assert_eq!(
        read_message(&[b"kv", &seq, &huge], "kv").map(|_| ()),
        Err(Refused {
            seq: Some(0),
            reason: Reject::Oversize
        })
    );
}

#[test]
fn a_prompt_stored_then_removed_names_the_gateways_keys() {
    let vocab = vocab();
    let text: Vec<u8> = (0..600u32).map(|i| b'a' + (i % 23) as u8).collect();
    let tokens: Vec<u32> = text[..592].iter().map(|&b| u32::from(b)).collect();
    let keys = prefix_hashes(&text, 256, 256);
    let mut sub = Subscriber::default();
    let hashes: Vec<u64> = (100..137).collect();
    let (seq, events) = message(0, vec![stored(None, &hashes, &tokens)]);
    let a = sub.apply(seq, &events, &vocab).unwrap();
    assert_eq!(a.stored, keys);
    assert!(!a.reset && a.missed == 0);
    // Batch 3 after 0: two missed. Removing the last block drops the second key.
    let (seq, events) = message(3, vec![removed(&[136, 135, 134, 133, 132, 131])]);
    let b = sub.apply(seq, &events, &vocab).unwrap();
    assert_eq!((b.missed, b.removed.clone()), (2, vec![keys[1]]));
    // Stored and removed within one batch: not resident after it.
    let (seq, events) = message(
        4,
        vec![
            stored(Some(130), &[131], &tokens[496..512]),
            removed(&[131]),
        ],
    );
    assert!(sub.apply(seq, &events, &vocab).unwrap().stored.is_empty());
    // Cleared: a reset; what is stored after it in the batch counts.
    let (seq, events) = message(
        5,
        vec![
            W::A(vec![W::S("AllBlocksCleared")]),
            stored(None, &hashes[..16], &tokens[..256]),
        ],
    );
    let c = sub.apply(seq, &events, &vocab).unwrap();
    assert!(c.reset);
    assert_eq!(c.stored, keys[..1].to_vec());
    assert!(c.removed.is_empty());
    // The sequence going back: the publisher restarted.
    let (seq, events) = message(0, vec![]);
    assert!(sub.apply(seq, &events, &vocab).unwrap().reset);
    assert!(sub.map.is_empty());
}

#[test]
fn a_token_outside_the_vocabulary_is_refused() {
    let mut sub = Subscriber::default();
    let (seq, events) = message(0, vec![stored(None, &[1], &[999; 16])]);
    assert_eq!(sub.apply(seq, &events, &vocab()), Err(Reject::Vocab));
}
