//! The text fields of a usage row, held without a heap allocation when short.
//!
//! A row lives about a second in the writer's queue and is dropped on the writer thread. With
//! `String` fields each request allocated six small blocks for its row, and another thread freed
//! them in bulk a second later (mimalloc's cross-thread free, and pages emptied far from the
//! thread that reuses them). Request ids (32 hex digits, or a client's UUID), key ids, tenant,
//! model and pool names and most worker URLs fit inline here; a longer value is shared
//! (`Arc<str>`), and names taken from the config are interned per thread, so a row never
//! allocates for them. (Most of the ledger column's page faults were the queue's regrowth, see
//! `RecentBatches`; this type's own effect was not measured apart.)

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

/// Longest text kept inline: a UUID (36) and a 38-character model name fit.
const INLINE: usize = 38;

/// Most long names a thread keeps interned (beyond it the table starts over).
const MAX_INTERNED: usize = 256;

/// One text field of a usage row: inline up to [`INLINE`] bytes, else shared.
#[derive(Clone)]
pub struct RowText(Repr);

#[derive(Clone)]
enum Repr {
    Inline { len: u8, bytes: [u8; INLINE] },
    Shared(Arc<str>),
}

impl RowText {
    /// An empty text.
    pub const EMPTY: RowText = RowText(Repr::Inline {
        len: 0,
        bytes: [0; INLINE],
    });

    /// `s`, inline when it fits (a longer one is copied into a new shared string).
    pub fn new(s: &str) -> Self {
        Self::inline(s).unwrap_or_else(|| RowText(Repr::Shared(Arc::from(s))))
    }

    /// `s`, a name from the config (tenant, model, pool, worker URL, version): inline when it
    /// fits, else shared with the earlier rows of this thread that named it.
    pub fn name(s: &str) -> Self {
        if let Some(t) = Self::inline(s) {
            return t;
        }
        thread_local! {
            static NAMES: RefCell<HashMap<Box<str>, Arc<str>>> = RefCell::new(HashMap::new());
        }
        NAMES.with(|names| {
            let mut names = names.borrow_mut();
            if let Some(shared) = names.get(s) {
                return RowText(Repr::Shared(shared.clone()));
            }
            if names.len() >= MAX_INTERNED {
                names.clear();
            }
            let shared: Arc<str> = Arc::from(s);
            names.insert(Box::from(s), shared.clone());
            RowText(Repr::Shared(shared))
        })
    }

    fn inline(s: &str) -> Option<Self> {
        let len = u8::try_from(s.len())
            .ok()
            .filter(|&l| usize::from(l) <= INLINE)?;
        let mut bytes = [0; INLINE];
        bytes[..s.len()].copy_from_slice(s.as_bytes());
        Some(RowText(Repr::Inline { len, bytes }))
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            // Always whole UTF-8 (copied from a `str`); the check cannot fail.
            Repr::Inline { len, bytes } => {
                std::str::from_utf8(&bytes[..usize::from(*len)]).unwrap_or_default()
            }
            Repr::Shared(s) => s,
        }
    }

    /// The text's bytes, without `as_str`'s UTF-8 check (the writer binds and groups by these).
    pub fn bytes(&self) -> &[u8] {
        match &self.0 {
            Repr::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Repr::Shared(s) => s.as_bytes(),
        }
    }

    /// Whether the text is empty.
    pub fn is_empty(&self) -> bool {
        self.bytes().is_empty()
    }
}

impl Default for RowText {
    fn default() -> Self {
        Self::EMPTY
    }
}

impl std::ops::Deref for RowText {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl From<&str> for RowText {
    fn from(s: &str) -> Self {
        Self::new(s)
    }
}

impl From<String> for RowText {
    fn from(s: String) -> Self {
        Self::new(&s)
    }
}

impl PartialEq for RowText {
    fn eq(&self, other: &Self) -> bool {
        self.bytes() == other.bytes()
    }
}

impl Eq for RowText {}

impl PartialEq<str> for RowText {
    fn eq(&self, other: &str) -> bool {
        self.bytes() == other.as_bytes()
    }
}

impl PartialEq<&str> for RowText {
    fn eq(&self, other: &&str) -> bool {
        self.bytes() == other.as_bytes()
    }
}

impl std::hash::Hash for RowText {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.bytes().hash(state);
    }
}

impl std::fmt::Debug for RowText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

impl std::fmt::Display for RowText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl rusqlite::ToSql for RowText {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        Ok(rusqlite::types::ToSqlOutput::Borrowed(
            rusqlite::types::ValueRef::Text(self.bytes()),
        ))
    }
}

impl rusqlite::types::FromSql for RowText {
    fn column_result(value: rusqlite::types::ValueRef<'_>) -> rusqlite::types::FromSqlResult<Self> {
        value.as_str().map(RowText::new)
    }
}

impl<'a> tokio_postgres::types::FromSql<'a> for RowText {
    fn from_sql(
        ty: &tokio_postgres::types::Type,
        raw: &'a [u8],
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        <&str as tokio_postgres::types::FromSql>::from_sql(ty, raw).map(RowText::new)
    }

    fn accepts(ty: &tokio_postgres::types::Type) -> bool {
        <&str as tokio_postgres::types::FromSql>::accepts(ty)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_texts_are_inline_and_long_ones_shared_whole() {
        for s in [
            "",
            "acme",
            "0123456789abcdef0123456789abcdef",
            "123e4567-e89b-12d3-a456-426614174000",
            &"é".repeat(19),
            &"x".repeat(INLINE),
        ] {
            let t = RowText::new(s);
            assert!(matches!(t.0, Repr::Inline { .. }), "{s}");
            assert_eq!(t, s);
            assert_eq!(RowText::name(s), s);
            assert_eq!(RowText::from(s.to_string()), s);
        }
        for s in [
            "x".repeat(INLINE + 1),
            "http://vllm-0.vllm.inference.svc.cluster.local:8000".into(),
            "ü".repeat(300),
        ] {
            let t = RowText::new(&s);
            assert!(matches!(t.0, Repr::Shared(_)), "{s}");
            assert_eq!(t, s.as_str());
            assert_eq!(t.len(), s.len());
            assert_eq!(RowText::from(s.clone()), s.as_str());
        }
        assert!(RowText::default().is_empty());
        assert_eq!(format!("{}", RowText::new("a,b")), "a,b");
        assert_eq!(format!("{:?}", RowText::new("a\"b")), "\"a\\\"b\"");
    }

    #[test]
    fn a_long_name_is_shared_between_rows_and_the_table_stays_bounded() {
        let url = "http://vllm-0.vllm.inference.svc.cluster.local:8000";
        let (a, b) = (RowText::name(url), RowText::name(url));
        match (&a.0, &b.0) {
            (Repr::Shared(a), Repr::Shared(b)) => assert!(Arc::ptr_eq(a, b)),
            _ => panic!("a long name is shared"),
        }
        // Many distinct long names: each still reads back whole.
        for i in 0..(MAX_INTERNED * 3) {
            let name = format!("{url}/{i}");
            assert_eq!(RowText::name(&name), name.as_str());
        }
        assert_eq!(RowText::name(url), url);
    }
}
