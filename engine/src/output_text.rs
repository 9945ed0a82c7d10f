//! Turns generated token text into what the client may see: cut at the first stop string, and
//! hold back any tail that could still become one, so a stream never shows text it must retract.

/// Incremental output text of one request with stop-string handling.
#[derive(Debug, Clone)]
pub struct OutputText {
    text: String,
    emitted: usize,
    stop: Vec<String>,
    longest_stop: usize,
    min_tokens: usize,
    tokens: usize,
    stopped: bool,
}

impl OutputText {
    /// Tracks output for `stop` strings, checked once `min_tokens` tokens exist.
    pub fn new(stop: Vec<String>, min_tokens: usize) -> Self {
        let longest_stop = stop.iter().map(String::len).max().unwrap_or(0);
        Self {
            text: String::new(),
            emitted: 0,
            stop,
            longest_stop,
            min_tokens,
            tokens: 0,
            stopped: false,
        }
    }

    /// Adds one token's text; returns the newly visible text.
    pub fn push(&mut self, piece: &str) -> String {
        if self.stopped {
            return String::new();
        }
        self.tokens += 1;
        self.push_text(piece)
    }

    /// Adds text that belongs to tokens already pushed (a character completed late).
    pub fn push_text(&mut self, piece: &str) -> String {
        if self.stopped {
            return String::new();
        }
        let search_from = self.emitted;
        self.text.push_str(piece);
        if self.tokens >= self.min_tokens && !self.stop.is_empty() {
            let hit = self
                .stop
                .iter()
                .filter_map(|s| self.text[search_from..].find(s.as_str()))
                .min();
            if let Some(pos) = hit {
                self.stopped = true;
                self.text.truncate(search_from + pos);
                return self.take_until(self.text.len());
            }
        }
        let mut safe = self
            .text
            .len()
            .saturating_sub(self.longest_stop.saturating_sub(1));
        while !self.text.is_char_boundary(safe) {
            safe -= 1;
        }
        self.take_until(safe.max(self.emitted))
    }

    /// Releases the held-back tail at the end of generation.
    pub fn finish(&mut self) -> String {
        self.take_until(self.text.len())
    }

    /// True once a stop string matched.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// Tokens pushed so far (including the one that completed a stop string).
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// All visible text so far plus the held-back tail.
    pub fn text(&self) -> &str {
        &self.text
    }

    fn take_until(&mut self, end: usize) -> String {
        let out = self.text[self.emitted..end].to_string();
        self.emitted = end;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_stop_strings_everything_passes_at_once() {
        let mut o = OutputText::new(vec![], 0);
        assert_eq!(o.push(" hello"), " hello");
        assert_eq!(o.push(" world"), " world");
        assert_eq!(o.finish(), "");
    }

    #[test]
    fn stop_string_split_across_tokens_is_cut_and_never_shown() {
        let mut o = OutputText::new(vec!["END".into()], 0);
        let mut seen = o.push(" a");
        seen += &o.push(" E");
        seen += &o.push("ND more");
        assert!(o.stopped());
        seen += &o.finish();
        assert_eq!(seen, " a ");
        assert_eq!(o.tokens(), 3);
    }

    #[test]
    fn held_back_tail_is_released_at_finish() {
        let mut o = OutputText::new(vec!["xyz".into()], 0);
        let mut seen = o.push(" abx");
        seen += &o.push("y");
        assert!(!o.stopped());
        seen += &o.finish();
        assert_eq!(seen, " abxy");
    }

    #[test]
    fn min_tokens_defers_stop_strings() {
        let mut o = OutputText::new(vec!["a".into()], 2);
        let first = o.push(" a");
        assert!(!o.stopped());
        assert_eq!(first, " a");
        o.push(" b");
        assert!(!o.stopped());
        o.push(" a");
        assert!(o.stopped());
        assert_eq!(o.text(), " a b ");
    }
}
