// Package manifest defines what Drover schedules: the pipe spec operators write
// (decoded from YAML with the line of every field), the signed per-agent
// manifest the server publishes, their validation with field paths, the
// targeting rule (Targets.Selects), the payload bundle format with its one
// inspection rule and limits (ScanBundle), and the cron schedule language with
// its exact evaluator. docs/design.md describes the contracts.
//
// It may be imported by anything (the server, the agent, api, signing, units,
// droverctl and drover-sim do) and imports no other Drover package. Its only
// I/O is reading the files a bundle is built from (ReadBundleFiles), unpacking
// a bundle (UnpackBundle) and loading time zones.
package manifest
