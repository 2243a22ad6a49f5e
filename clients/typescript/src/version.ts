/** This SDK's version: equal to package.json's and to the repository's VERSION (a test checks both). */
export const VERSION = "0.2.0";

/** The user agent every call sends. */
export const USER_AGENT = `ctxfold-typescript/${VERSION}`;
