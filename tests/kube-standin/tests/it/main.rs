//! Integration tests of the stand-in, the simulator and the kmock wrapper.
