//! Which producers a config data source takes part in: an exact name in
//! `producer_name_filter`, or a full match of any
//! `producer_name_regex_filter`; with both empty, every producer (ARCHITECTURE.md
//! §8.2). Built-in sources are producer `perfetto.traced_probes`.

/// The producer filters of one config data source.
#[derive(Clone, Debug, Default)]
pub(crate) struct ProducerFilter {
    pub names: Vec<String>,
    /// Anchored at both ends.
    pub patterns: Vec<regex::Regex>,
}

impl ProducerFilter {
    /// Whether producer `name` takes part.
    pub(crate) fn admits(&self, name: &str) -> bool {
        (self.names.is_empty() && self.patterns.is_empty())
            || self.names.iter().any(|n| n == name)
            || self.patterns.iter().any(|p| p.is_match(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_or_full_matches_admit_and_no_filter_admits_all() {
        assert!(ProducerFilter::default().admits("anything"));
        let f = ProducerFilter {
            names: vec!["com.example.app".into()],
            patterns: vec![regex::Regex::new("^(?:ex.*_[0-9]+)$").expect("pattern")],
        };
        assert!(f.admits("com.example.app"));
        assert!(f.admits("example_12"));
        assert!(!f.admits("com.example.app2"));
        assert!(!f.admits("xexample_12"));
        assert!(!f.admits("perfetto.traced_probes"));
    }
}
