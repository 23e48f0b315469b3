//! Where `monad-client login` takes the token from, so that it need not be in argv (where other
//! users of the machine can read it in the process list, and shells keep it in their history).
//!
//! In order: `--token` (still accepted), the `MONAD_TOKEN` environment variable, then standard
//! input: its first line when it is not a terminal, or a prompt that does not echo when it is.

use std::io::{BufRead, Write};

/// Where the token comes from, decided from what is there ([`source`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// Given with `--token` or in `MONAD_TOKEN`.
    Given(String),
    /// The first line of standard input (not a terminal).
    FirstLine,
    /// Asked for on the terminal, without echo.
    Prompt,
}

/// Where to take the token from: `flag` (`--token`), else `env` (`MONAD_TOKEN`, when not
/// empty), else standard input, read as a line or asked for on the terminal.
pub fn source(flag: Option<String>, env: Option<String>, stdin_is_terminal: bool) -> TokenSource {
    match flag.or(env.filter(|t| !t.trim().is_empty())) {
        Some(token) => TokenSource::Given(token.trim().to_owned()),
        None if stdin_is_terminal => TokenSource::Prompt,
        None => TokenSource::FirstLine,
    }
}

/// The error when no token came from anywhere.
pub const MISSING: &str = "no token: pass it in MONAD_TOKEN (`MONAD_TOKEN=mnd_… monad-client \
                           login --server HOST:PORT --fingerprint SHA256`), on standard input, \
                           or with --token";

/// The token from `source`, trimmed; `None` when there is none (an empty line, end of input).
pub fn read(source: TokenSource) -> std::io::Result<Option<String>> {
    let line = match source {
        TokenSource::Given(token) => token,
        TokenSource::FirstLine => {
            let mut line = String::new();
            std::io::stdin().lock().read_line(&mut line)?;
            line
        }
        TokenSource::Prompt => {
            let quiet = crate::terminal::Modes::unechoed()?;
            monad_protocol::output::err("token (not shown as you type): ");
            let _ = std::io::stderr().flush();
            let mut line = String::new();
            let read = std::io::stdin().lock().read_line(&mut line);
            drop(quiet);
            monad_protocol::output::err("\n");
            read?;
            line
        }
    };
    let token = line.trim();
    Ok((!token.is_empty()).then(|| token.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_wins_then_the_environment_then_standard_input() {
        let s = |v: &str| Some(v.to_owned());
        assert_eq!(source(s("a"), s("b"), true), TokenSource::Given("a".into()));
        assert_eq!(
            source(None, s(" b\n"), true),
            TokenSource::Given("b".into())
        );
        assert_eq!(source(None, s(""), true), TokenSource::Prompt);
        assert_eq!(source(None, None, true), TokenSource::Prompt);
        assert_eq!(source(None, None, false), TokenSource::FirstLine);
        assert_eq!(
            read(TokenSource::Given("  mnd_x \n".into())).unwrap(),
            Some("mnd_x".into())
        );
        assert_eq!(read(TokenSource::Given(" ".into())).unwrap(), None);
    }
}
