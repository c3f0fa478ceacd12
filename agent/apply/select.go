package apply

import (
	"context"
	"fmt"
)

// Backend names for Select.
const (
	BackendAuto    = "auto"
	BackendSystemd = "systemd"
	BackendCron    = "cron"
)

// Select returns the backend want names ("" = auto) for cfg.Scope: auto is
// systemd when the manager of that scope answers on D-Bus, else cron. It
// logs the choice and, for auto, why.
func Select(ctx context.Context, want string, cfg Config) (Backend, error) {
	// Only a service manager needs the user session; the cron backend
	// (and auto's fallback to it) does not.
	full, err := cfg.defaults(want == BackendSystemd)
	if err != nil {
		return nil, err
	}
	log := full.Logger
	switch want {
	case BackendSystemd:
		b, err := NewSystemd(ctx, cfg)
		if err != nil {
			return nil, err
		}
		log.Info("apply backend: systemd", "scope", full.Scope, "unit_dir", full.UnitDir)
		return b, nil
	case BackendCron:
		log.Info("apply backend: cron", "data_dir", full.DataDir)
		return NewCron(cfg)
	case "", BackendAuto:
		b, err := NewSystemd(ctx, cfg)
		if err == nil {
			log.Info("apply backend: systemd (auto: its D-Bus answers)", "scope", full.Scope, "unit_dir", full.UnitDir)
			return b, nil
		}
		log.Info("apply backend: cron (auto: systemd unavailable)", "scope", full.Scope, "reason", err.Error())
		return NewCron(cfg)
	default:
		return nil, fmt.Errorf("backend %q: use auto, systemd or cron", want)
	}
}
