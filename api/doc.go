// Package api is Drover's HTTP wire contract: every request and response
// body of the server's JSON API (/api/v1/...), the error body and its codes,
// and the names of run statuses and triggers as the API and the store spell
// them. The server, the agent, droverctl and drover-sim all use these types;
// none of them keeps a copy. The gRPC contract is package proto.
//
// It may be imported by anything; it imports only the domain packages
// manifest, signing and proto. docs/design.md describes the API.
package api
