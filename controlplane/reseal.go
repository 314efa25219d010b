package controlplane

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weirhq/weir/controlplane/db"
	"github.com/weirhq/weir/controlplane/seal"
)

// ResealReport is what a key rotation found and did.
type ResealReport struct {
	// KeyID names the current key (KeyID), never the key.
	KeyID string
	// Accounts is how many accounts hold a sealed credential.
	Accounts int
	// Stale is how many of them had a credential or refresh token sealed
	// otherwise than a new seal would be: under a previous key, or in the
	// version 1 format that names no key.
	Stale int
	// Resealed is how many were re-sealed under the current key (0 in a
	// dry run).
	Resealed int
	// StaleSettings and ResealedSettings are the same for the sealed
	// settings (the default egress proxy).
	StaleSettings, ResealedSettings int
}

// AccountRef names an account without anything secret: its id and label.
type AccountRef struct {
	ID    uuid.UUID
	Label string
}

// UnreadableError lists the accounts whose credential, refresh token or
// egress proxy opens with none of the keys, and the sealed settings that
// do not. A rotation that finds one changes nothing.
type UnreadableError struct {
	Accounts []AccountRef
	// Settings are the names of sealed settings (egress_proxy).
	Settings []string
}

func (e *UnreadableError) Error() string {
	names := make([]string, len(e.Accounts))
	for i, a := range e.Accounts {
		names[i] = fmt.Sprintf("%s (%s)", a.ID, a.Label)
	}
	msg := fmt.Sprintf("%d account(s) have a credential that opens with none of the keys: %s", len(e.Accounts), strings.Join(names, ", "))
	if len(e.Settings) > 0 {
		if len(e.Accounts) == 0 {
			msg = ""
		} else {
			msg += "; "
		}
		msg += "the setting(s) " + strings.Join(e.Settings, ", ") + " open with none of the keys"
	}
	return msg
}

// Reseal re-seals, under current, every account credential and refresh
// token not yet sealed under it, opening them with current or any of
// previous: the second step of a key rotation, run once every control
// plane knows the new key. It is safe next to running control planes: the
// rows it rewrites are locked for its one transaction, and it writes them
// at the revision it read. It is idempotent: a second run finds nothing
// stale. When a credential opens with no key it returns an
// *UnreadableError and writes nothing. With dryRun it only counts.
func Reseal(ctx context.Context, pool *pgxpool.Pool, current []byte, previous [][]byte, dryRun bool) (ResealReport, error) {
	s, err := seal.New(current, previous...)
	if err != nil {
		return ResealReport{}, err
	}
	rep := ResealReport{KeyID: seal.KeyID(current)}
	rows, err := db.New(pool).SealedCredentials(ctx)
	if err != nil {
		return rep, fmt.Errorf("read sealed credentials: %w", err)
	}
	rep.Accounts = len(rows)
	settings, err := db.New(pool).SealedSettings(ctx)
	if err != nil {
		return rep, fmt.Errorf("read sealed settings: %w", err)
	}
	stale, err := staleRows(s, rows)
	staleSet, serr := staleSettings(s, settings)
	if err = joinUnreadable(err, serr); err != nil {
		return rep, err
	}
	rep.Stale, rep.StaleSettings = len(stale), len(staleSet)
	if dryRun || len(stale)+len(staleSet) == 0 {
		return rep, nil
	}
	ids := make([]uuid.UUID, len(stale))
	for i, r := range stale {
		ids[i] = r.ID
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		q := db.New(tx)
		locked, err := q.LockSealedCredentials(ctx, ids)
		if err != nil {
			return fmt.Errorf("lock accounts: %w", err)
		}
		// Re-read under the lock: a refresh may have written since.
		rows := make([]db.SealedCredentialsRow, len(locked))
		for i, r := range locked {
			rows[i] = db.SealedCredentialsRow(r)
		}
		stale, err := staleRows(s, rows)
		if err != nil {
			return err
		}
		if err := resealSettings(ctx, q, s, &rep); err != nil {
			return err
		}
		p := db.ResealCredentialsParams{}
		for _, r := range stale {
			p.Ids = append(p.Ids, r.ID)
			p.Revisions = append(p.Revisions, r.CredentialRevision)
			p.CredentialSealed = append(p.CredentialSealed, s.Seal(r.ID, r.CredentialRevision, r.access))
			var refresh []byte
			if r.RefreshSealed != nil {
				refresh = s.SealRefresh(r.ID, r.CredentialRevision, r.refresh)
			}
			p.RefreshSealed = append(p.RefreshSealed, refresh)
			var proxy []byte
			if r.EgressProxySealed != nil {
				proxy = s.SealProxy(r.ID, r.proxy)
			}
			p.EgressProxySealed = append(p.EgressProxySealed, proxy)
		}
		n, err := q.ResealCredentials(ctx, p)
		if err != nil {
			return fmt.Errorf("write re-sealed credentials: %w", err)
		}
		rep.Resealed = int(n)
		return nil
	})
	if err != nil {
		rep.Resealed, rep.ResealedSettings = 0, 0
	}
	return rep, err
}

// resealSettings re-seals, under the lock, the sealed settings not sealed
// under the current key.
func resealSettings(ctx context.Context, q *db.Queries, s *seal.Sealer, rep *ResealReport) error {
	locked, err := q.LockSealedSettings(ctx)
	if err != nil {
		return fmt.Errorf("lock sealed settings: %w", err)
	}
	rows := make([]db.SealedSettingsRow, len(locked))
	for i, r := range locked {
		rows[i] = db.SealedSettingsRow(r)
	}
	stale, err := staleSettings(s, rows)
	if err != nil {
		return err
	}
	for _, r := range stale {
		n, err := q.ResealSetting(ctx, db.ResealSettingParams{Name: r.name, Sealed: s.SealProxy(uuid.Nil, r.plain)})
		if err != nil {
			return fmt.Errorf("write re-sealed setting %s: %w", r.name, err)
		}
		rep.ResealedSettings += int(n)
	}
	return nil
}

// staleSetting is a sealed setting that needs re-sealing, opened.
type staleSetting struct{ name, plain string }

// staleSettings opens every sealed setting (the default egress proxy,
// bound to uuid.Nil) and returns those not sealed under the current key,
// or an *UnreadableError naming those that do not open.
func staleSettings(s *seal.Sealer, rows []db.SealedSettingsRow) ([]staleSetting, error) {
	var stale []staleSetting
	var bad []string
	for _, r := range rows {
		plain, err := s.OpenProxy(uuid.Nil, r.Sealed)
		switch {
		case err != nil:
			bad = append(bad, r.Name)
		case !s.Current(r.Sealed):
			stale = append(stale, staleSetting{name: r.Name, plain: plain})
		}
	}
	if len(bad) > 0 {
		return nil, &UnreadableError{Settings: bad}
	}
	return stale, nil
}

// joinUnreadable is one *UnreadableError of the accounts' and the
// settings' (either may be nil), or the first other error.
func joinUnreadable(accounts, settings error) error {
	var a, st *UnreadableError
	switch {
	case accounts != nil && !errors.As(accounts, &a):
		return accounts
	case settings != nil && !errors.As(settings, &st):
		return settings
	case a == nil && st == nil:
		return nil
	}
	out := &UnreadableError{}
	if a != nil {
		out.Accounts = a.Accounts
	}
	if st != nil {
		out.Settings = st.Settings
	}
	return out
}

// staleRow is an account whose credential needs re-sealing, opened.
type staleRow struct {
	db.SealedCredentialsRow
	access, refresh, proxy string
}

// staleRows opens every row and returns those not sealed under the
// current key, or an *UnreadableError naming every row that does not open.
func staleRows(s *seal.Sealer, rows []db.SealedCredentialsRow) ([]staleRow, error) {
	var stale []staleRow
	var bad []AccountRef
	for _, r := range rows {
		access, err := s.Open(r.ID, r.CredentialRevision, r.CredentialSealed)
		current := s.Current(r.CredentialSealed)
		refresh, proxy := "", ""
		if err == nil && r.RefreshSealed != nil {
			refresh, err = s.OpenRefresh(r.ID, r.CredentialRevision, r.RefreshSealed)
			current = current && s.Current(r.RefreshSealed)
		}
		if err == nil && r.EgressProxySealed != nil {
			proxy, err = s.OpenProxy(r.ID, r.EgressProxySealed)
			current = current && s.Current(r.EgressProxySealed)
		}
		switch {
		case err != nil:
			bad = append(bad, AccountRef{ID: r.ID, Label: r.Label})
		case !current:
			stale = append(stale, staleRow{SealedCredentialsRow: r, access: access, refresh: refresh, proxy: proxy})
		}
	}
	if len(bad) > 0 {
		return nil, &UnreadableError{Accounts: bad}
	}
	return stale, nil
}

// TargetResealReport is what a key rotation found and did of the
// notification targets.
type TargetResealReport struct {
	// Targets is how many targets there are; Stale how many had a seal
	// (URL or signing secret) not under the current key; Resealed how many
	// were re-sealed (0 in a dry run).
	Targets, Stale, Resealed int
}

// ResealTargets re-seals, under current, every notification target's URL
// and signing secret not yet sealed under it, as Reseal does credentials,
// in one transaction holding the targets' rows. A target whose seal opens
// with no key fails the rotation of the targets, naming it, and nothing of
// them is written (remove the target and add it again). With dryRun it
// only counts.
func ResealTargets(ctx context.Context, pool *pgxpool.Pool, current []byte, previous [][]byte, dryRun bool) (TargetResealReport, error) {
	s, err := seal.New(current, previous...)
	if err != nil {
		return TargetResealReport{}, err
	}
	var rep TargetResealReport
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		q := db.New(tx)
		rows, err := q.LockNotifyTargetSeals(ctx)
		if err != nil {
			return fmt.Errorf("lock notification targets: %w", err)
		}
		rep.Targets = len(rows)
		for _, r := range rows {
			url, err := s.OpenTarget(r.ID, targetURLField, r.UrlSealed)
			current := s.Current(r.UrlSealed)
			secret := ""
			if err == nil && r.SecretSealed != nil {
				secret, err = s.OpenTarget(r.ID, targetSecretField, r.SecretSealed)
				current = current && s.Current(r.SecretSealed)
			}
			if err != nil {
				return fmt.Errorf("notification target %s (%s): its URL or signing secret opens with none of the keys; "+
					"remove it and add it again (weir notify remove, weir notify add)", r.ID, r.Name)
			}
			if current {
				continue
			}
			rep.Stale++
			if dryRun {
				continue
			}
			p := db.ResealNotifyTargetParams{ID: r.ID, UrlSealed: s.SealTarget(r.ID, targetURLField, url)}
			if r.SecretSealed != nil {
				p.SecretSealed = s.SealTarget(r.ID, targetSecretField, secret)
			}
			if err := q.ResealNotifyTarget(ctx, p); err != nil {
				return fmt.Errorf("write re-sealed notification target %s: %w", r.Name, err)
			}
			rep.Resealed++
		}
		return nil
	})
	if err != nil {
		rep.Resealed = 0
	}
	return rep, err
}
