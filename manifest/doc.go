// Package manifest defines what Drover schedules: the pipe spec operators write,
// the signed per-agent manifest the server publishes, their validation with field
// paths, and the cron schedule language with its exact evaluator.
//
// It is imported by the server, the agent, droverctl and the units package. It
// does no I/O beyond decoding the bytes it is given and loading time zones.
package manifest
