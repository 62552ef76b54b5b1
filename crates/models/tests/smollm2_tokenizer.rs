//! SmolLM2's tokenizer and chat template, rebuilt from the GGUF, against
//! transformers (`tests/fixtures/smollm2-135m/reference.json`). Needs
//! `scripts/fetch-model.sh`.

use bastion_models::{GgufFile, Message, Tokenizer};
use bastion_testkit::{smollm2_gguf, u32s, Fixture};

fn tokenizer() -> Tokenizer {
    let path = smollm2_gguf();
    Tokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap()
}

#[test]
fn tokenization_and_decoding_match_transformers() {
    let fx = Fixture::load("smollm2-135m");
    let tok = tokenizer();
    assert_eq!(tok.vocab_size(), 49152);
    let cases = fx.json["tokenization"].as_array().unwrap();
    assert_eq!(cases.len(), 33);
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let ids = tok.encode(text, false).unwrap();
        assert_eq!(ids, u32s(&case["ids"]), "ids of {text:?}");
        assert_eq!(tok.encode(text, true).unwrap(), u32s(&case["ids_with_default_add_special_tokens"]), "{text:?}");
        let pieces: Vec<String> =
            case["tokens"].as_array().unwrap().iter().map(|t| t.as_str().unwrap().to_string()).collect();
        assert_eq!(tok.pieces(text).unwrap(), pieces, "pieces of {text:?}");
        assert_eq!(tok.decode(&ids, false).unwrap(), case["decoded"].as_str().unwrap(), "decode of {text:?}");
        assert_eq!(tok.decode(&ids, true).unwrap(), case["decoded_skip_special_tokens"].as_str().unwrap(), "{text:?}");
    }
}

#[test]
fn chat_template_renders_match_transformers() {
    let fx = Fixture::load("smollm2-135m");
    let tok = tokenizer();
    let chat = tok.chat_template().expect("SmolLM2 ships a chat template");
    let renders = fx.json["chat_template_renders"].as_object().unwrap();
    assert_eq!(renders.len(), 3);
    for (name, case) in renders {
        let messages: Vec<Message> = case["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| Message::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
            .collect();
        let rendered = chat.render(&messages, true).unwrap();
        assert_eq!(rendered, case["rendered"].as_str().unwrap(), "{name}: rendered text");
        assert_eq!(tok.encode(&rendered, false).unwrap(), u32s(&case["ids"]), "{name}: ids");
    }
    assert_eq!(tok.eos_ids(), &[2]);
}

/// A long conversation (40 messages of 10,000 characters: far past the
/// model's context) renders within the chat template's fuel.
#[test]
fn long_conversations_render_within_the_template_budget() {
    let tok = tokenizer();
    let chat = tok.chat_template().unwrap();
    let messages: Vec<Message> = (0..40)
        .map(|i| Message::new(if i % 2 == 0 { "user" } else { "assistant" }, &format!("{i} ").repeat(5_000)[..10_000]))
        .collect();
    let rendered = chat.render(&messages, true).unwrap();
    assert!(rendered.len() > 400_000 && rendered.ends_with("<|im_start|>assistant\n"), "{}", rendered.len());
}

/// The literal text of a special token inside a user message becomes that
/// token's id, as transformers' tokenizer does by default (docs/algorithms.md
/// §7); the rest of the message is tokenized as text.
#[test]
fn special_token_text_in_a_message_is_the_special_token() {
    let tok = tokenizer();
    let chat = tok.chat_template().unwrap();
    let plain = chat.render(&[Message::new("user", "say AB")], true).unwrap();
    let tricky = chat.render(&[Message::new("user", "say A<|im_end|>B")], true).unwrap();
    let (plain, tricky) = (tok.encode(&plain, false).unwrap(), tok.encode(&tricky, false).unwrap());
    let im_end = tok.encode("<|im_end|>", false).unwrap();
    assert_eq!(im_end.len(), 1, "one special id");
    let count = |ids: &[u32]| ids.iter().filter(|&&t| t == im_end[0]).count();
    assert_eq!(count(&tricky), count(&plain) + 1, "the literal became the special token");
    // The same ids as encoding the message text on its own, spliced in.
    let inner = tok.encode("say A<|im_end|>B", false).unwrap();
    assert!(tricky.windows(inner.len()).any(|w| w == inner.as_slice()));
}
