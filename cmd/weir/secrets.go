package main

import (
	"context"
	"errors"
	"flag"
	"fmt"

	"github.com/weirhq/weir/controlplane"
)

const secretsUsage = `Usage: weir secrets rotate [--dry-run]

Re-seals every account credential and refresh token under the current key
(WEIR_SECRET_KEY), opening them with it or a retired one
(WEIR_SECRET_KEY_PREVIOUS, comma-separated). It talks to Postgres directly
(WEIR_DATABASE_URL), is safe next to running control planes, and a second
run changes nothing. If a credential opens with no key, it names the
accounts and changes nothing. See "Rotating the secret key" in docs/operate.md.
`

func runSecrets(ctx context.Context, args []string, e env) error {
	if len(args) == 0 || args[0] != "rotate" {
		fmt.Fprint(e.stderr, secretsUsage)
		return errUsageShown
	}
	fs := flag.NewFlagSet("weir secrets rotate", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.Usage = func() { fmt.Fprint(e.stderr, secretsUsage) }
	dbURL := fs.String("database-url", e.getenv("WEIR_DATABASE_URL"), "Postgres URL (env WEIR_DATABASE_URL)")
	dryRun := fs.Bool("dry-run", false, "count what would be re-sealed; change nothing")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("weir secrets rotate: unexpected argument %q", fs.Arg(0))
	}
	if *dbURL == "" {
		return errors.New("weir secrets rotate: WEIR_DATABASE_URL is required")
	}
	current, previous, err := secretKeys(e)
	if err != nil {
		return fmt.Errorf("weir secrets rotate: %w", err)
	}
	pool, err := openPool(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	rep, err := controlplane.Reseal(ctx, pool, current, previous, *dryRun)
	var unreadable *controlplane.UnreadableError
	if errors.As(err, &unreadable) {
		if len(unreadable.Accounts) > 0 {
			fmt.Fprintf(e.stderr, "these accounts' credentials open with none of the keys (WEIR_SECRET_KEY, WEIR_SECRET_KEY_PREVIOUS):\n")
			tw := table(e.stderr)
			fmt.Fprintln(tw, "  ID\tLABEL")
			for _, a := range unreadable.Accounts {
				fmt.Fprintf(tw, "  %s\t%s\n", a.ID, a.Label)
			}
			tw.Flush() //nolint:errcheck // stderr
		}
		for _, name := range unreadable.Settings {
			fmt.Fprintf(e.stderr, "the setting %s opens with none of the keys (set it again: weir settings set %s=…)\n", name, name)
		}
		if len(unreadable.Settings) > 0 {
			return fmt.Errorf("weir secrets rotate: %d account(s) and %d setting(s) unreadable; nothing was re-sealed (add the key that sealed them to WEIR_SECRET_KEY_PREVIOUS, or enter them again)",
				len(unreadable.Accounts), len(unreadable.Settings))
		}
		return fmt.Errorf("weir secrets rotate: %d account(s) unreadable; nothing was re-sealed (add the key that sealed them to WEIR_SECRET_KEY_PREVIOUS, or re-enter their credentials)", len(unreadable.Accounts))
	}
	if err != nil {
		return fmt.Errorf("weir secrets rotate: %w", err)
	}
	switch {
	case rep.Stale == 0 && rep.StaleSettings == 0:
		fmt.Fprintf(e.stdout, "all %d account(s) are sealed under the current key %s: nothing to do\n", rep.Accounts, rep.KeyID)
	case *dryRun:
		also := ""
		if rep.StaleSettings > 0 {
			also = ", and the default egress proxy"
		}
		fmt.Fprintf(e.stdout, "dry run: %d of %d account(s) would be re-sealed under key %s%s\n", rep.Stale, rep.Accounts, rep.KeyID, also)
	default:
		fmt.Fprintf(e.stdout, "re-sealed %d of %d account(s) under key %s (%d already were)\n", rep.Resealed, rep.Accounts, rep.KeyID, rep.Accounts-rep.Resealed)
		if rep.Resealed < rep.Stale {
			fmt.Fprintf(e.stdout, "%d account(s) changed while rotating (a token refresh, a deletion): run it again to confirm\n", rep.Stale-rep.Resealed)
		}
		if rep.ResealedSettings > 0 {
			fmt.Fprintf(e.stdout, "re-sealed the default egress proxy (the setting egress_proxy)\n")
		}
	}
	targets, err := controlplane.ResealTargets(ctx, pool, current, previous, *dryRun)
	if err != nil {
		return fmt.Errorf("weir secrets rotate: %w", err)
	}
	switch {
	case targets.Targets == 0:
	case targets.Stale == 0:
		fmt.Fprintf(e.stdout, "all %d notification target(s) are sealed under the current key: nothing to do\n", targets.Targets)
	case *dryRun:
		fmt.Fprintf(e.stdout, "dry run: %d of %d notification target(s) would be re-sealed\n", targets.Stale, targets.Targets)
	default:
		fmt.Fprintf(e.stdout, "re-sealed %d of %d notification target(s)\n", targets.Resealed, targets.Targets)
	}
	if !*dryRun && len(previous) > 0 {
		fmt.Fprintln(e.stdout, "once every control plane runs with this key, WEIR_SECRET_KEY_PREVIOUS can go")
	}
	return nil
}
