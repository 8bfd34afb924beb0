package claimvalidation

import (
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Result is the verdict on one object. Each finding is a *field.Error whose Field is the path of
// what is wrong as the user wrote it (empty when the finding is about the object as a whole, its
// version) and whose Detail says what is wrong and the fix. Any finding in Errors rejects the
// object; Warnings are shown to the user. The paths stay structured until ErrorMessages and
// WarningMessages print them.
type Result struct {
	Errors   field.ErrorList
	Warnings field.ErrorList

	// configRuns are the runs [start, end) of Errors that are one GpuConfig's errors: they print
	// as one message in the field package's own form, as the kubelet plugin reports them.
	configRuns [][2]int
}

func (r *Result) add(deny bool, e *field.Error) {
	if deny {
		r.Errors = append(r.Errors, e)
	} else {
		r.Warnings = append(r.Warnings, e)
	}
}

// addConfig records the errors of one opaque GpuConfig; they always deny.
func (r *Result) addConfig(errs field.ErrorList) {
	start := len(r.Errors)
	r.Errors = append(r.Errors, errs...)
	r.configRuns = append(r.configRuns, [2]int{start, len(r.Errors)})
}

// ErrorMessages prints Errors as the admission response and kubectl dra validate show them, one
// message per finding (nil when there is none).
func (r *Result) ErrorMessages() []string {
	var out []string
	for i := 0; i < len(r.Errors); i++ {
		if run, ok := r.configRunAt(i); ok {
			out = append(out, r.Errors[run[0]:run[1]].ToAggregate().Error())
			i = run[1] - 1
			continue
		}
		out = append(out, message(r.Errors[i]))
	}
	return out
}

// WarningMessages prints Warnings, one message per finding (nil when there is none).
func (r *Result) WarningMessages() []string {
	var out []string
	for _, e := range r.Warnings {
		out = append(out, message(e))
	}
	return out
}

func (r *Result) configRunAt(i int) ([2]int, bool) {
	for _, run := range r.configRuns {
		if run[0] == i {
			return run, true
		}
	}
	return [2]int{}, false
}

// message is "<field>: <detail>", or the detail alone for a finding about the whole object.
func message(e *field.Error) string {
	if e.Field == "" {
		return e.Detail
	}
	return e.Field + ": " + e.Detail
}
