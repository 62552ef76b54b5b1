//! Chat templates: the model's own Jinja template rendered with `minijinja`
//! the way transformers renders it (`apply_chat_template`: trim_blocks,
//! lstrip_blocks, loop controls, Python string methods via
//! `minijinja-contrib`'s pycompat).
//!
//! A chat template is code that arrives with a model file. It renders with
//! a bounded budget ([`CHAT_TEMPLATE_FUEL`], minijinja's fuel: about one unit
//! per instruction and per 64 bytes the template builds), so a template that
//! loops without end or builds a gigantic string fails with an error naming
//! its file instead of hanging or exhausting memory; it sees only the
//! render context (no loader: `include` / `import` of other files fail).

use minijinja::{context, Environment, Error, ErrorKind};
use serde::Serialize;

use crate::error::{FormatError, Result};

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

impl Message {
    /// A message with `role` and `content`.
    pub fn new(role: &str, content: &str) -> Self {
        Self { role: role.to_string(), content: content.to_string() }
    }
}

/// The fuel of one render of a chat template: about one unit per
/// instruction and per 64 bytes created (output included), so at most about
/// 2·10⁶ instructions or 128 MB. Real templates need a few thousand units per
/// message (the tests render long MT-Bench conversations with SmolLM2's and
/// Qwen3's templates well within it).
pub const CHAT_TEMPLATE_FUEL: u64 = 2_000_000;

/// A compiled chat template with its special-token strings.
pub struct ChatTemplate {
    env: Environment<'static>,
    origin: std::path::PathBuf,
    bos_token: String,
    eos_token: String,
}

impl ChatTemplate {
    /// Compiles `source` (from `tokenizer_config.json` `chat_template` or GGUF
    /// `tokenizer.chat_template`); `origin` names that file in errors.
    ///
    /// # Errors
    /// [`FormatError::Config`] naming `origin` when the template does not parse.
    pub fn new(source: &str, bos_token: &str, eos_token: &str, origin: &std::path::Path) -> Result<Self> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .expect("default delimiters are valid");
        env.set_syntax(syntax);
        env.set_fuel(Some(CHAT_TEMPLATE_FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> std::result::Result<String, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_template_owned("chat", source.to_string()).map_err(|e| FormatError::Config {
            path: origin.to_path_buf(),
            field: "chat_template".into(),
            expected: format!("a valid Jinja template ({e})"),
        })?;
        Ok(Self {
            env,
            origin: origin.to_path_buf(),
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        })
    }

    /// Renders `messages`, ending with the assistant header when
    /// `add_generation_prompt`; `enable_thinking = false` is passed for
    /// templates that read it (Qwen3).
    ///
    /// # Errors
    /// [`FormatError::Template`] naming the template's file when rendering
    /// fails (the template raises, or runs past [`CHAT_TEMPLATE_FUEL`]).
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let tmpl = self.env.get_template("chat").expect("added in new");
        tmpl.render(context! {
            messages => minijinja::value::Serde(messages),
            add_generation_prompt => add_generation_prompt,
            enable_thinking => false,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
        })
        .map_err(|e| {
            let origin = self.origin.display();
            FormatError::Template(if e.kind() == ErrorKind::OutOfFuel {
                format!(
                    "{origin}: chat_template: stopped after its budget of {CHAT_TEMPLATE_FUEL} fuel (about one unit \
                     per instruction and per 64 bytes built): a template that loops without end or builds a \
                     gigantic string"
                )
            } else {
                format!("{origin}: chat_template: failed to render: {e}")
            })
        })
    }
}
