//! Gang-scheduling PodGroups, one module per scheduler: [`coscheduling`] for the
//! scheduler-plugins coscheduling plugin and [`volcano`] for the Volcano scheduler.

pub mod coscheduling;
pub mod volcano;
