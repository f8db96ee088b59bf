package threadwire

import (
	"context"
	"errors"
	"fmt"
)

// Code is a gRPC status code, as the server answers them.
type Code uint32

// The status codes (Response.code).
const (
	OK                 Code = 0
	Cancelled          Code = 1
	Unknown            Code = 2
	InvalidArgument    Code = 3
	DeadlineExceeded   Code = 4
	NotFound           Code = 5
	AlreadyExists      Code = 6
	PermissionDenied   Code = 7
	ResourceExhausted  Code = 8
	FailedPrecondition Code = 9
	Aborted            Code = 10
	OutOfRange         Code = 11
	Unimplemented      Code = 12
	Internal           Code = 13
	Unavailable        Code = 14
	DataLoss           Code = 15
	Unauthenticated    Code = 16
)

var codeNames = [...]string{
	"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
	"PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
	"UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
}

func (c Code) String() string {
	if int(c) < len(codeNames) {
		return codeNames[c]
	}
	return fmt.Sprintf("CODE(%d)", uint32(c))
}

// StatusError is a failed call: the server's status code and message, or a
// local one (UNAVAILABLE for a lost connection, DEADLINE_EXCEEDED and
// CANCELLED for the context, which errors.Is also matches).
type StatusError struct {
	Code    Code
	Message string
	cause   error
}

func (e *StatusError) Error() string { return fmt.Sprintf("threadwire: %s: %s", e.Code, e.Message) }

// Unwrap gives the local cause (context.DeadlineExceeded, a network error), if any.
func (e *StatusError) Unwrap() error { return e.cause }

// CodeOf is err's status code: OK for nil, the code of a *StatusError or of
// a gRPC status error (GRPCClient's calls), UNKNOWN for other errors.
func CodeOf(err error) Code {
	if err == nil {
		return OK
	}
	var status *StatusError
	if errors.As(err, &status) {
		return status.Code
	}
	if code, ok := grpcCode(err); ok {
		return code
	}
	return Unknown
}

func contextError(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return &StatusError{Code: DeadlineExceeded, Message: "the deadline passed before the response", cause: err}
	}
	return &StatusError{Code: Cancelled, Message: "the call was cancelled", cause: err}
}
