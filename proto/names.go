package agentpb

import (
	"fmt"
	"strings"
)

// This file is written by hand (not generated): the lower-case names of
// the enums, as the runner's flags and environment (DROVER_TRIGGER), the
// agent's status JSON and its run records on disk spell them. A name is
// the enum value's name without its prefix: TRIGGER_CATCHUP is "catchup",
// RUN_STATUS_TIMED_OUT is "timed_out".

// Name is the trigger's lower-case name ("schedule", "catchup", "manual",
// "api"), or "unknown".
func (t Trigger) Name() string {
	if t == Trigger_TRIGGER_UNSPECIFIED || Trigger_name[int32(t)] == "" {
		return "unknown"
	}
	return strings.ToLower(strings.TrimPrefix(t.String(), "TRIGGER_"))
}

// Name is the run status's lower-case name ("succeeded", "timed_out", ...),
// or "unknown".
func (s RunStatus) Name() string {
	if s == RunStatus_RUN_STATUS_UNSPECIFIED || RunStatus_name[int32(s)] == "" {
		return "unknown"
	}
	return strings.ToLower(strings.TrimPrefix(s.String(), "RUN_STATUS_"))
}

// ParseTrigger parses a trigger's name (see Trigger.Name), ignoring case
// and surrounding space.
func ParseTrigger(s string) (Trigger, error) {
	name := strings.ToLower(strings.TrimSpace(s))
	if name != "" && name != "unknown" && name != "unspecified" {
		if v, ok := Trigger_value["TRIGGER_"+strings.ToUpper(name)]; ok {
			return Trigger(v), nil
		}
	}
	return 0, fmt.Errorf("unknown trigger %q (use schedule, catchup, manual or api)", s)
}
