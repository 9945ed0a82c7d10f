//! A step's batch flattened into the per-token arrays a GPU forward pass reads: token ids,
//! positions, KV-cache slots, the owning sequence of each token and the block tables. Pure, so
//! the `cuda` backend's input layout (padding of graph batches included) is tested on any
//! machine.

use crate::model::forward::SeqChunk;

/// The device inputs of one step, `len` rows (tokens) long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepPlan {
    /// Token id of each row (0 in padding rows).
    pub tokens: Vec<u32>,
    /// Position of each row in its sequence; -1 marks a padding row (no RoPE, no attention).
    pub pos: Vec<i32>,
    /// Cache slot (`block * block_size + offset`) each row's K/V is stored in; -1: nowhere.
    pub slots: Vec<i64>,
    /// Row of `block_tables` of each row's sequence (0 in padding rows).
    pub seq_of: Vec<i32>,
    /// One row of `width` block ids per chunk, zero-filled past the chunk's blocks.
    pub block_tables: Vec<i32>,
    /// Blocks per row of `block_tables`.
    pub width: usize,
    /// Flattened row of the last token of each chunk that wants logits, in chunk order.
    pub last_rows: Vec<usize>,
    /// Per chunk: its first position and its rows `first..first + len`.
    spans: Vec<(usize, usize, usize)>,
}

impl StepPlan {
    /// The plan of `chunks` with `block_size`-token blocks and block tables `width` wide,
    /// padded with empty rows up to `pad_to` rows (a graph's capture size; pass 0 for none).
    /// A chunk whose positions its block table does not cover, a table wider than `width`, or
    /// a token id outside `vocab_size` is an error.
    pub fn new(
        chunks: &[SeqChunk<'_>],
        block_size: usize,
        width: usize,
        pad_to: usize,
        vocab_size: usize,
    ) -> Result<Self, String> {
        let n: usize = chunks.iter().map(|c| c.tokens.len()).sum();
        let len = n.max(pad_to);
        let mut plan = Self {
            tokens: Vec::with_capacity(len),
            pos: Vec::with_capacity(len),
            slots: Vec::with_capacity(len),
            seq_of: Vec::with_capacity(len),
            block_tables: vec![0; chunks.len() * width],
            width,
            last_rows: Vec::new(),
            spans: Vec::with_capacity(chunks.len()),
        };
        for (i, ch) in chunks.iter().enumerate() {
            let end = ch.start + ch.tokens.len();
            if end.div_ceil(block_size) > ch.block_table.len() {
                return Err(format!(
                    "chunk {i} reaches position {end} but holds {} blocks",
                    ch.block_table.len()
                ));
            }
            if ch.block_table.len() > width {
                return Err(format!(
                    "chunk {i} holds {} blocks, more than the {width} a sequence of the context length can",
                    ch.block_table.len()
                ));
            }
            plan.spans
                .push((ch.start, plan.tokens.len(), ch.tokens.len()));
            for (j, &b) in ch.block_table.iter().enumerate() {
                plan.block_tables[i * width + j] = b as i32;
            }
            for (k, &tok) in ch.tokens.iter().enumerate() {
                if tok as usize >= vocab_size {
                    return Err(format!(
                        "token id {tok} is outside the vocabulary of {vocab_size}"
                    ));
                }
                let p = ch.start + k;
                let block = ch.block_table[p / block_size] as i64;
                plan.tokens.push(tok);
                plan.pos.push(p as i32);
                plan.slots
                    .push(block * block_size as i64 + (p % block_size) as i64);
                plan.seq_of.push(i as i32);
            }
            if ch.want_logits && !ch.tokens.is_empty() {
                plan.last_rows.push(plan.tokens.len() - 1);
            }
        }
        plan.tokens.resize(len, 0);
        plan.pos.resize(len, -1);
        plan.slots.resize(len, -1);
        plan.seq_of.resize(len, 0);
        Ok(plan)
    }

    /// The flattened row of position `pos` of chunk `chunk`, if the step computes it.
    pub fn row_of(&self, chunk: usize, pos: usize) -> Option<usize> {
        let &(start, first, len) = self.spans.get(chunk)?;
        (pos >= start && pos < start + len).then(|| first + pos - start)
    }

    /// Rows, padding included.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether the step computes nothing.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk<'a>(tokens: &'a [u32], start: usize, table: &'a [u32]) -> SeqChunk<'a> {
        SeqChunk {
            tokens,
            start,
            block_table: table,
            want_logits: true,
            prompt_len: 0,
        }
    }

    #[test]
    fn rows_map_through_each_sequences_block_table() {
        // A 3-token prefill chunk at positions 3..6 over blocks [7, 2] (block size 4), then one
        // decode token at position 9 of a sequence on blocks [5, 1, 8].
        let (a, b) = ([10, 11, 12], [13]);
        let chunks = [chunk(&a, 3, &[7, 2]), chunk(&b, 9, &[5, 1, 8])];
        let p = StepPlan::new(&chunks, 4, 4, 0, 100).unwrap();
        assert_eq!(p.tokens, vec![10, 11, 12, 13]);
        assert_eq!(p.pos, vec![3, 4, 5, 9]);
        // Position 3 is slot 3 of block 7; 4 and 5 are slots 0 and 1 of block 2; 9 is slot 1
        // of block 8.
        assert_eq!(p.slots, vec![28 + 3, 8, 9, 33]);
        assert_eq!(p.seq_of, vec![0, 0, 0, 1]);
        assert_eq!(p.block_tables, vec![7, 2, 0, 0, 5, 1, 8, 0]);
        assert_eq!(p.last_rows, vec![2, 3]);
        assert_eq!((p.row_of(0, 4), p.row_of(1, 9)), (Some(1), Some(3)));
        assert_eq!(
            (p.row_of(0, 6), p.row_of(1, 8), p.row_of(2, 0)),
            (None, None, None)
        );
    }

    #[test]
    fn a_graph_batch_pads_with_rows_that_touch_nothing() {
        let (a, b, c) = ([1], [2], [3]);
        let chunks = [
            chunk(&a, 0, &[0]),
            chunk(&b, 5, &[1, 2]),
            chunk(&c, 2, &[3]),
        ];
        let p = StepPlan::new(&chunks, 4, 2, 4, 10).unwrap();
        assert_eq!(p.len(), 4);
        assert_eq!(p.tokens[3], 0);
        assert_eq!((p.pos[3], p.slots[3], p.seq_of[3]), (-1, -1, 0));
        assert_eq!(p.last_rows, vec![0, 1, 2]);
    }

    #[test]
    fn chunks_without_logits_and_bad_inputs() {
        let a = [1, 2];
        let mut ch = chunk(&a, 0, &[0]);
        ch.want_logits = false;
        let p = StepPlan::new(&[ch], 4, 1, 0, 10).unwrap();
        assert!(p.last_rows.is_empty());
        assert!(StepPlan::new(&[], 4, 1, 0, 10).unwrap().is_empty());

        let uncovered = chunk(&a, 3, &[0]);
        assert!(
            StepPlan::new(&[uncovered], 4, 4, 0, 10)
                .unwrap_err()
                .contains("reaches position 5")
        );
        let wide = chunk(&a, 0, &[0, 1, 2]);
        assert!(StepPlan::new(&[wide], 4, 2, 0, 10).is_err());
        let big = [99];
        assert!(
            StepPlan::new(&[chunk(&big, 0, &[0])], 4, 1, 0, 10)
                .unwrap_err()
                .contains("outside the vocabulary")
        );
    }
}
