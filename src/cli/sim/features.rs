//! What a replayed request's features (`n`, logprobs, tools, `response_format`, image parts)
//! make the engine do, decided by the engine's own code rather than a copy of its rules: the
//! body `bench` sends goes through the engine's OpenAI parser, which refuses what the engine
//! refuses (image parts on a text-only model: 400) and reads its choices, sequences and
//! logprobs; the sequences' sampling parameters are then built as the engine's server builds
//! them (`SamplingParams::for_choices`, `sequence_logprobs`). Tools and `response_format`
//! leave the engine's path as it is (it records them, and answers text either way).
//!
//! A plain request (no features) never comes here: it keeps the one sequence it always had.

use infergate_engine::flight::Features;
use infergate_engine::openai::{self, ChatTemplate};
use infergate_engine::request::{SamplingParams, sequence_logprobs};

use crate::workload::{PlannedRequest, request_body};

/// The engine's parser, as the simulated clients call it.
pub(super) struct EngineParser {
    template: ChatTemplate,
    /// Clients use `/v1/chat/completions` (else `/v1/completions`).
    chat: bool,
}

impl EngineParser {
    /// A parser of the bodies of chat clients when `chat`, else of completions clients.
    pub(super) fn new(chat: bool) -> Self {
        Self {
            template: ChatTemplate::default_chatml(),
            chat,
        }
    }

    /// The sampling parameters of each sequence the engine runs for `req` (which has
    /// features) and the features its flight record names, or the status of its refusal.
    pub(super) fn sequences(
        &self,
        req: &PlannedRequest,
    ) -> Result<(Vec<SamplingParams>, Features), u16> {
        // The features do not depend on the prompt's words: one token stands in for them.
        let stand_in = PlannedRequest {
            prompt: req.prompt.iter().take(1).copied().collect(),
            session: None,
            tenant: None,
            class: None,
            ..req.clone()
        };
        let body = request_body(&stand_in, "sim", self.chat).to_string();
        let parsed = if self.chat {
            openai::parse_chat(body.as_bytes(), &self.template)
        } else {
            openai::parse_completion(body.as_bytes())
        }
        .map_err(|e| e.status.as_u16())?;
        let mut sampling = parsed.sampling;
        sampling.max_tokens = req.output_tokens.max(1) as usize;
        sampling.seed = sampling.seed.or(Some(req.id));
        sampling.logprobs = sequence_logprobs(parsed.logprobs, parsed.n, parsed.best_of);
        let features = parsed.features.with_plan(
            parsed.prompts.len(),
            parsed.n,
            parsed.best_of,
            parsed.logprobs.is_some(),
        );
        Ok((sampling.for_choices(parsed.best_of).collect(), features))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use infergate::trace::TraceFeatures;
    use std::time::Duration;

    fn planned(features: TraceFeatures) -> PlannedRequest {
        PlannedRequest {
            id: 7,
            at: Duration::ZERO,
            tenant: None,
            class: None,
            session: None,
            group: None,
            prompt: vec![1, 2, 3],
            output_tokens: 12,
            features: Some(features),
        }
    }

    #[test]
    fn choices_run_as_sequences_with_their_logprobs() {
        let f = TraceFeatures {
            n: 3,
            logprobs: true,
            top_logprobs: 2,
            tools: 2,
            ..TraceFeatures::default()
        };
        for chat in [true, false] {
            let (seqs, flight) = EngineParser::new(chat).sequences(&planned(f)).unwrap();
            assert_eq!(seqs.len(), 3);
            assert_eq!((flight.n, flight.best_of, flight.prompts), (3, 3, 1));
            assert!(flight.logprobs && flight.stream);
            assert!(flight.tools, "{flight:?}");
            assert!(
                seqs.iter()
                    .all(|p| p.logprobs == Some(2) && p.max_tokens == 12)
            );
            assert!(seqs.iter().all(|p| p.ignore_eos));
            assert_eq!(seqs[0].seed, Some(7));
            assert_ne!(seqs[1].seed, seqs[2].seed);
        }
        let plain_format = TraceFeatures {
            response_format: Some(infergate::trace::features::ResponseFormat::JsonObject),
            ..TraceFeatures::default()
        };
        let (one, flight) = EngineParser::new(true)
            .sequences(&planned(plain_format))
            .unwrap();
        assert!(flight.response_format && !flight.logprobs);
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].logprobs, None);
    }

    #[test]
    fn the_engine_refuses_image_parts_on_chat() {
        let f = TraceFeatures {
            images: 1,
            ..TraceFeatures::default()
        };
        assert_eq!(EngineParser::new(true).sequences(&planned(f)), Err(400));
        // Completions carry no image parts: nothing to refuse.
        assert_eq!(
            EngineParser::new(false)
                .sequences(&planned(f))
                .map(|s| s.0.len()),
            Ok(1)
        );
    }
}
