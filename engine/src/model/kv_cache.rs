//! The paged KV cache of the cpu backend: one slab of f32 per block, addressed through the block
//! tables the engine's block manager hands out, so prefix sharing and preemption are the same as
//! on the sim backend.

use crate::block_manager::BlockId;

/// K and V for every layer of every block.
pub struct KvCache {
    block_size: usize,
    num_layers: usize,
    kv_dim: usize,
    num_blocks: usize,
    /// `[block][layer][k|v][slot][kv_dim]`.
    data: Vec<f32>,
}

impl KvCache {
    /// Bytes one block takes for a model of `num_layers` layers and `kv_dim` key width.
    pub fn block_bytes(block_size: usize, num_layers: usize, kv_dim: usize) -> usize {
        2 * block_size * num_layers * kv_dim * std::mem::size_of::<f32>()
    }

    /// A zeroed cache of `num_blocks` blocks.
    pub fn new(num_blocks: usize, block_size: usize, num_layers: usize, kv_dim: usize) -> Self {
        Self {
            block_size,
            num_layers,
            kv_dim,
            num_blocks,
            data: vec![0.0; num_blocks * 2 * block_size * num_layers * kv_dim],
        }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks in the cache.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    fn offset(&self, table: &[BlockId], layer: usize, kind: usize, pos: usize) -> usize {
        let block = table[pos / self.block_size] as usize;
        debug_assert!(block < self.num_blocks && layer < self.num_layers);
        (((block * self.num_layers + layer) * 2 + kind) * self.block_size + pos % self.block_size)
            * self.kv_dim
    }

    /// Stores the key and value of the token at `pos` of the sequence owning `table`.
    pub fn write(&mut self, table: &[BlockId], layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        let ko = self.offset(table, layer, 0, pos);
        self.data[ko..ko + self.kv_dim].copy_from_slice(&k[..self.kv_dim]);
        let vo = self.offset(table, layer, 1, pos);
        self.data[vo..vo + self.kv_dim].copy_from_slice(&v[..self.kv_dim]);
    }

    /// The key of the token at `pos` (all KV heads).
    pub fn key(&self, table: &[BlockId], layer: usize, pos: usize) -> &[f32] {
        let o = self.offset(table, layer, 0, pos);
        &self.data[o..o + self.kv_dim]
    }

    /// The value of the token at `pos` (all KV heads).
    pub fn value(&self, table: &[BlockId], layer: usize, pos: usize) -> &[f32] {
        let o = self.offset(table, layer, 1, pos);
        &self.data[o..o + self.kv_dim]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_map_through_the_block_table() {
        let mut c = KvCache::new(4, 2, 3, 5);
        let table = [3, 1];
        for pos in 0..4 {
            for layer in 0..3 {
                let k = vec![(pos * 10 + layer) as f32; 5];
                let v = vec![-((pos * 10 + layer) as f32); 5];
                c.write(&table, layer, pos, &k, &v);
            }
        }
        for pos in 0..4 {
            for layer in 0..3 {
                assert_eq!(c.key(&table, layer, pos)[4], (pos * 10 + layer) as f32);
                assert_eq!(c.value(&table, layer, pos)[0], -((pos * 10 + layer) as f32));
            }
        }
        // Another sequence sharing block 3 (a cached prefix) sees the same keys.
        assert_eq!(c.key(&[3], 2, 1)[0], 12.0);
        assert_eq!(KvCache::block_bytes(2, 3, 5), 2 * 2 * 3 * 5 * 4);
    }
}
