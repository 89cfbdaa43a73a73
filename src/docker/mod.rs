//! Talking to a Docker Engine or a BuildKit daemon: endpoints (unix, TCP, TLS), the engine
//! connection and what it can do, and BuildKit's control API with its session (file sync,
//! secrets, SSH). Imports only `registry` (credentials for the session) and `base`.

pub mod buildkit;
pub mod container;
pub mod endpoint;
pub mod engine;
pub mod libpod;
