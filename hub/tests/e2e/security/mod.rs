//! Attacks a hostile tenant or a compromised spoke would try, each driven
//! over the network against a running hub (and spoke), each shown refused
//! with a clear error while the hub keeps serving everyone else.

mod authority;
mod limits;
mod namespaces;
mod sandbox;
