// SPDX-License-Identifier: MIT
/*
 * s3xml on responses shaped like AWS's documentation samples and like what
 * radosgw sends (S3 xmlns, empty Message, empty ETag), and on hostile ones.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "objstore/s3xml.h"

#define XMLDECL "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
#define S3NS " xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\""

static int parse_list(const char *s, struct s3xml_list *l)
{
	return s3xml_parse_list(s, strlen(s), l);
}

static void test_list_aws(void)
{
	/* The ListObjectsV2 response sample, truncated with a token. */
	static const char doc[] = XMLDECL
		"<ListBucketResult" S3NS ">\n"
		"  <Name>bucket</Name>\n  <Prefix/>\n  <KeyCount>2</KeyCount>\n"
		"  <MaxKeys>1000</MaxKeys>\n  <IsTruncated>true</IsTruncated>\n"
		"  <Contents>\n    <Key>ExampleObject.txt</Key>\n"
		"    <LastModified>2013-09-17T18:07:53.000Z</LastModified>\n"
		"    <ETag>\"599bab3ed2c697f1d26842727561fd94\"</ETag>\n"
		"    <Size>857</Size>\n    <StorageClass>REDUCED_REDUNDANCY"
		"</StorageClass>\n  </Contents>\n"
		"  <Contents>\n    <Key>my-image.jpg</Key>\n"
		"    <LastModified>2009-10-12T17:50:30.000Z</LastModified>\n"
		"    "
		"<ETag>&quot;fba9dede5f27731c9771645a39863328&quot;</ETag>\n"
		"    <Size>434234</Size>\n    <StorageClass>STANDARD"
		"</StorageClass>\n  </Contents>\n"
		"  "
		"<NextContinuationToken>1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/"
		"wm36Hy4vbO"
		"wM=</NextContinuationToken>\n"
		"</ListBucketResult>\n";
	struct s3xml_list l;

	CHECK_INT(parse_list(doc, &l), 0);
	CHECK_INT(l.nobjects, 2);
	CHECK(l.truncated);
	CHECK_STR(l.next_token,
		  "1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=");
	if (l.nobjects == 2) {
		CHECK_STR(l.objects[0].key, "ExampleObject.txt");
		CHECK_INT(l.objects[0].size, 857);
		CHECK_STR(l.objects[0].etag,
			  "\"599bab3ed2c697f1d26842727561fd94\"");
		CHECK_INT(l.objects[0].mtime, 1379441273);
		CHECK_STR(l.objects[1].key, "my-image.jpg");
		CHECK_INT(l.objects[1].size, 434234);
		CHECK_STR(l.objects[1].etag,
			  "\"fba9dede5f27731c9771645a39863328\"");
		CHECK_INT(l.objects[1].mtime, 1255369830);
	}
	s3xml_list_release(&l);
	CHECK(l.objects == NULL && l.nobjects == 0 && l.next_token == NULL);
	s3xml_list_release(NULL);
}

static void test_list_rgw(void)
{
	/* radosgw: xmlns, last page, no token, no namespace prefix games,
	 * keys with entities and UTF-8, a huge but valid size. */
	static const char doc[] = XMLDECL
		"<ListBucketResult" S3NS "><Name>ds</Name>"
		"<Prefix>train/</Prefix><MaxKeys>1000</MaxKeys>"
		"<IsTruncated>false</IsTruncated>"
		"<Contents><Key>train/a&amp;b &lt;1&gt; &quot;q&quot; &apos;"
		"caf\xc3\xa9.tar</Key>"
		"<LastModified>2024-02-29T23:59:59.123Z</LastModified>"
		"<ETag>\"d41d8cd98f00b204e9800998ecf8427e-3\"</ETag>"
		"<Size>9223372036854775807</Size><StorageClass>STANDARD"
		"</StorageClass><Owner><ID>u</ID><DisplayName>u</DisplayName>"
		"</Owner><Type>Normal</Type></Contents>"
		"<Contents><Key><![CDATA[train/x<y>.bin]]></Key><Size>0</Size>"
		"</Contents>"
		"<KeyCount>2</KeyCount></ListBucketResult>";
	struct s3xml_list l;

	CHECK_INT(parse_list(doc, &l), 0);
	CHECK(!l.truncated);
	CHECK(l.next_token == NULL);
	CHECK_INT(l.nobjects, 2);
	if (l.nobjects == 2) {
		CHECK_STR(l.objects[0].key,
			  "train/a&b <1> \"q\" 'caf\xc3\xa9.tar");
		CHECK(l.objects[0].size == 9223372036854775807ull);
		CHECK_INT(l.objects[0].mtime, 1709251199);
		CHECK_STR(l.objects[1].key, "train/x<y>.bin");
		CHECK_STR(l.objects[1].etag, "");
		CHECK_INT(l.objects[1].mtime, 0);
	}
	s3xml_list_release(&l);

	/* An empty bucket, no namespace at all */
	CHECK_INT(parse_list("<ListBucketResult><Name>b</Name><KeyCount>0"
			     "</KeyCount><IsTruncated>false</IsTruncated>"
			     "</ListBucketResult>",
			     &l),
		  0);
	CHECK_INT(l.nobjects, 0);
	s3xml_list_release(&l);
}

static void test_list_url_encoded(void)
{
	static const char doc[] =
		"<ListBucketResult" S3NS "><EncodingType>url</EncodingType>"
		"<IsTruncated>false</IsTruncated>"
		"<Contents><Key>dir%2Fa+b%2Bc%25d%C3%A9%0A</Key><Size>1</Size>"
		"</Contents></ListBucketResult>";
	static const char nul[] =
		"<ListBucketResult><EncodingType>url</EncodingType>"
		"<Contents><Key>a%00b</Key><Size>1</Size></Contents>"
		"</ListBucketResult>";
	static const char badpct[] =
		"<ListBucketResult><EncodingType>url</EncodingType>"
		"<Contents><Key>a%zzb</Key><Size>1</Size></Contents>"
		"</ListBucketResult>";
	static const char plain[] =
		"<ListBucketResult><Contents><Key>a+b%20c</Key><Size>1</Size>"
		"</Contents></ListBucketResult>";
	struct s3xml_list l;

	CHECK_INT(parse_list(doc, &l), 0);
	if (l.nobjects == 1)
		CHECK_STR(l.objects[0].key, "dir/a b+c%d\xc3\xa9\n");
	s3xml_list_release(&l);
	CHECK_INT(parse_list(nul, &l), -EINVAL);
	CHECK_INT(parse_list(badpct, &l), -EINVAL);
	/* Without EncodingType keys are taken literally. */
	CHECK_INT(parse_list(plain, &l), 0);
	if (l.nobjects == 1)
		CHECK_STR(l.objects[0].key, "a+b%20c");
	s3xml_list_release(&l);
}

static void test_list_bad(void)
{
	static const char *const bad[] = {
		"",
		"<ListBucketResult>",
		"<ListBucketResult><Contents><Key>a</Key><Size>1</Size>",
		"<ListAllMyBucketsResult></ListAllMyBucketsResult>",
		"<Error><Code>NoSuchBucket</Code></Error>",
		"not xml at all",
		"<ListBucketResult><Contents><Size>1</Size></Contents>"
		"</ListBucketResult>",
		"<ListBucketResult><Contents><Key>a</Key></Contents>"
		"</ListBucketResult>",
		"<ListBucketResult><Contents><Key>a</Key><Size>-1</Size>"
		"</Contents></ListBucketResult>",
		"<ListBucketResult><Contents><Key>a</Key><Size>1e3</Size>"
		"</Contents></ListBucketResult>",
		"<ListBucketResult><Contents><Key>a</Key>"
		"<Size>9223372036854775808</Size></Contents></"
		"ListBucketResult>",
		"<ListBucketResult><Contents><Key>a</Key>"
		"<Size>99999999999999999999999999</Size></Contents>"
		"</ListBucketResult>",
		"<ListBucketResult><Contents><Key>a</Key><Size>1</Size>"
		"<LastModified>yesterday</LastModified></Contents>"
		"</ListBucketResult>",
		"<ListBucketResult><IsTruncated>maybe</IsTruncated>"
		"</ListBucketResult>",
		"<ListBucketResult><Contents><Key></Key><Size>1</Size>"
		"</Contents></ListBucketResult>",
		"<ListBucketResult><Contents><Key>&undefined;</Key><Size>1"
		"</Size></Contents></ListBucketResult>",
		"<ListBucketResult><Contents><Key>a&#0;</Key><Size>1</Size>"
		"</Contents></ListBucketResult>",
	};
	struct s3xml_list l;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int r = parse_list(bad[i], &l);

		if (r != -EINVAL)
			fprintf(stderr, "bad[%zu] gave %d\n", i, r);
		CHECK_INT(r, -EINVAL);
		CHECK(l.objects == NULL && l.nobjects == 0);
	}
	CHECK_INT(parse_list("<ListBucketResult/><x/>", &l), -EINVAL);
	/* Bytes after the end, and an embedded NUL */
	CHECK_INT(s3xml_parse_list("<ListBucketResult/>\0<x/>", 24, &l),
		  -EINVAL);
}

static void test_hostile(void)
{
	static const char laughs[] =
		"<?xml version=\"1.0\"?>\n<!DOCTYPE lolz [\n"
		" <!ENTITY lol \"lol\">\n"
		" <!ENTITY lol2 \"&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;\">\n"
		" <!ENTITY lol3 "
		"\"&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;\">\n"
		" <!ENTITY lol4 "
		"\"&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;\">\n"
		"]>\n<ListBucketResult><Contents><Key>&lol4;</Key><Size>1"
		"</Size></Contents></ListBucketResult>";
	static const char xxe[] =
		"<?xml version=\"1.0\"?>\n<!DOCTYPE r [<!ENTITY x SYSTEM "
		"\"file:///etc/passwd\">]>\n<Error><Code>&x;</Code></Error>";
	static const char ext[] =
		"<!DOCTYPE Error SYSTEM \"http://127.0.0.1:1/x.dtd\">"
		"<Error><Code>X</Code></Error>";
	struct s3xml_list l;
	struct s3xml_error e;
	char *etag = NULL;
	char *deep;
	enum { DEEP_SIZE = 100000 * 3 + 64 };

	CHECK_INT(parse_list(laughs, &l), -EINVAL);
	CHECK_INT(s3xml_parse_error(xxe, strlen(xxe), &e), -EINVAL);
	CHECK_STR(e.code, "");
	CHECK_INT(s3xml_parse_error(ext, strlen(ext), &e), -EINVAL);
	CHECK_INT(s3xml_parse_complete(xxe, strlen(xxe), &etag, &e), -EINVAL);
	CHECK(etag == NULL);

	/* Deep nesting stops at libxml2's depth limit, not the stack. */
	deep = malloc(DEEP_SIZE);
	if (deep) {
		char *p = deep;

		p += snprintf(p, DEEP_SIZE, "<ListBucketResult>");
		for (int i = 0; i < 100000; i++)
			p += snprintf(p, DEEP_SIZE - (size_t)(p - deep), "<a>");
		CHECK_INT(parse_list(deep, &l), -EINVAL);
		free(deep);
	}
	/* Over the body bound */
	CHECK_INT(s3xml_parse_list("<a/>", S3XML_MAX_BODY + 1, &l), -EINVAL);
}

static void test_error(void)
{
	static const char aws[] =
		XMLDECL "<Error>\n  <Code>NoSuchKey</Code>\n"
			"  <Message>The resource you requested does not "
			"exist</Message>\n"
			"  <Resource>/mybucket/myfoto.jpg</Resource>\n"
			"  <RequestId>4442587FB7D0A2F9</RequestId>\n</Error>";
	static const char rgw[] = XMLDECL
		"<Error><Code>NoSuchBucket</Code><Message></Message>"
		"<BucketName>nope</BucketName><RequestId>tx0000</RequestId>"
		"<HostId>abc-default</HostId></Error>";
	struct s3xml_error e;
	char longmsg[1024];
	int n;

	CHECK_INT(s3xml_parse_error(aws, strlen(aws), &e), 0);
	CHECK_STR(e.code, "NoSuchKey");
	CHECK_STR(e.message, "The resource you requested does not exist");
	CHECK_INT(s3xml_parse_error(rgw, strlen(rgw), &e), 0);
	CHECK_STR(e.code, "NoSuchBucket");
	CHECK_STR(e.message, "");
	CHECK_INT(s3xml_parse_error("<Error/>", 8, &e), 0);
	CHECK_STR(e.code, "");
	CHECK_INT(s3xml_parse_error("<html>502</html>", 16, &e), -EINVAL);
	CHECK_INT(s3xml_parse_error("Bad Gateway", 11, &e), -EINVAL);
	CHECK_INT(s3xml_parse_error("", 0, &e), -EINVAL);

	n = snprintf(longmsg, sizeof(longmsg),
		     "<Error><Code>SlowDown</Code>"
		     "<Message>");
	memset(longmsg + n, 'm', 600);
	snprintf(longmsg + n + 600, sizeof(longmsg) - (size_t)n - 600,
		 "</Message></Error>");
	CHECK_INT(s3xml_parse_error(longmsg, strlen(longmsg), &e), 0);
	CHECK_INT(strlen(e.message), sizeof(e.message) - 1);
}

static void test_upload_id(void)
{
	static const char doc[] = XMLDECL
		"<InitiateMultipartUploadResult" S3NS ">"
		"<Bucket>example-bucket</Bucket><Key>example-object</Key>"
		"<UploadId>"
		"VXBsb2FkIElEIGZvciA2aWWpbmcncyBteS1tb3ZpZS5tMnRzIHVwbG"
		"9hZA</UploadId></InitiateMultipartUploadResult>";
	static const char empty[] = "<InitiateMultipartUploadResult><UploadId/>"
				    "</InitiateMultipartUploadResult>";
	char *id = NULL;

	CHECK_INT(s3xml_parse_upload_id(doc, strlen(doc), &id), 0);
	CHECK_STR(id, "VXBsb2FkIElEIGZvciA2aWWpbmcncyBteS1tb3ZpZS5tMnRzIHVwbG"
		      "9hZA");
	free(id);
	CHECK_INT(s3xml_parse_upload_id(empty, strlen(empty), &id), -EINVAL);
	CHECK(id == NULL);
	CHECK_INT(s3xml_parse_upload_id("<Error/>", 8, &id), -EINVAL);
}

/* ListMultipartUploads: a page with its next markers, as AWS documents
 * it; a bad Upload makes the whole page invalid. */
static void test_mpu_list(void)
{
	static const char doc[] =
		XMLDECL "<ListMultipartUploadsResult" S3NS ">"
			"<Bucket>b</Bucket><KeyMarker/><UploadIdMarker/>"
			"<NextKeyMarker>my-movie.m2ts</NextKeyMarker>"
			"<NextUploadIdMarker>YW55IGlkZWE</NextUploadIdMarker>"
			"<MaxUploads>2</MaxUploads><IsTruncated>true"
			"</IsTruncated>"
			"<Upload><Key>my-divisor</Key><UploadId>XMgbGlrZSBl"
			"</UploadId><Initiated>2010-11-10T20:48:33.000Z"
			"</Initiated></Upload>"
			"<Upload><Key>my &amp; movie.m2ts</Key><UploadId>"
			"YW55IGlkZWE</UploadId></Upload>"
			"</ListMultipartUploadsResult>";
	static const char none[] = "<ListMultipartUploadsResult>"
				   "<IsTruncated>false</IsTruncated>"
				   "</ListMultipartUploadsResult>";
	static const char noid[] = "<ListMultipartUploadsResult><Upload>"
				   "<Key>k</Key></Upload>"
				   "</ListMultipartUploadsResult>";
	static const char badtime[] = "<ListMultipartUploadsResult><Upload>"
				      "<Key>k</Key><UploadId>i</UploadId>"
				      "<Initiated>yesterday</Initiated>"
				      "</Upload></ListMultipartUploadsResult>";
	struct s3xml_mpu_list l;

	CHECK_INT(s3xml_parse_mpu_list(doc, strlen(doc), &l), 0);
	CHECK(l.truncated);
	CHECK_STR(l.next_key, "my-movie.m2ts");
	CHECK_STR(l.next_id, "YW55IGlkZWE");
	CHECK_INT(l.nuploads, 2);
	if (l.nuploads == 2) {
		CHECK_STR(l.uploads[0].key, "my-divisor");
		CHECK_STR(l.uploads[0].upload_id, "XMgbGlrZSBl");
		CHECK_INT(l.uploads[0].initiated, 1289422113);
		CHECK_STR(l.uploads[1].key, "my & movie.m2ts");
		CHECK_INT(l.uploads[1].initiated, 0);
	}
	s3xml_mpu_list_release(&l);
	CHECK_INT(s3xml_parse_mpu_list(none, strlen(none), &l), 0);
	CHECK(!l.truncated && l.nuploads == 0 && !l.next_key);
	s3xml_mpu_list_release(&l);
	CHECK_INT(s3xml_parse_mpu_list(noid, strlen(noid), &l), -EINVAL);
	CHECK(l.nuploads == 0 && !l.uploads);
	CHECK_INT(s3xml_parse_mpu_list(badtime, strlen(badtime), &l), -EINVAL);
	CHECK_INT(s3xml_parse_mpu_list("<ListBucketResult/>", 19, &l), -EINVAL);
}

static void test_complete(void)
{
	static const char ok[] =
		XMLDECL "<CompleteMultipartUploadResult" S3NS ">"
			"<Location>http://Example-Bucket.s3.amazonaws.com/"
			"Example-Object"
			"</Location><Bucket>Example-Bucket</Bucket>"
			"<Key>Example-Object</Key>"
			"<ETag>\"3858f62230ac3c915f300c664312c11f-9\"</ETag>"
			"</CompleteMultipartUploadResult>";
	static const char rgw_empty[] =
		"<CompleteMultipartUploadResult" S3NS "><Location>l</Location>"
		"<Bucket>b</Bucket><Key>k</Key><ETag></ETag>"
		"</CompleteMultipartUploadResult>";
	static const char copy[] =
		"<CopyObjectResult><LastModified>2009-10-28T22:32:00"
		"</LastModified><ETag>&quot;9b2cf535f27731c974343645a3985328"
		"&quot;</ETag></CopyObjectResult>";
	static const char part[] =
		XMLDECL "<CopyPartResult xmlns=\"http://s3.amazonaws.com/doc/"
			"2006-03-01/\"><LastModified>2024-01-02T03:04:05.000Z"
			"</LastModified><ETag>5f363e0e58a95f06cbe9bbc662c5dfb6"
			"</ETag></CopyPartResult>";
	static const char err200[] = XMLDECL
		"\n\n\n<Error><Code>InternalError</Code>"
		"<Message>We encountered an internal error. Please try again."
		"</Message><RequestId>656c76696e6727732072657175657374</"
		"RequestId>"
		"<HostId>Uuag1LuByRx9e6j5Onimru9pO4ZVKnJ2Qz7/"
		"C1NPcfTWAtRPfTaOFg=="
		"</HostId></Error>";
	struct s3xml_error e;
	char *etag = NULL;

	CHECK_INT(s3xml_parse_complete(ok, strlen(ok), &etag, &e), 0);
	CHECK_STR(etag, "\"3858f62230ac3c915f300c664312c11f-9\"");
	free(etag);
	CHECK_INT(
		s3xml_parse_complete(rgw_empty, strlen(rgw_empty), &etag, NULL),
		0);
	CHECK_STR(etag, "");
	free(etag);
	CHECK_INT(s3xml_parse_complete(copy, strlen(copy), &etag, NULL), 0);
	CHECK_STR(etag, "\"9b2cf535f27731c974343645a3985328\"");
	free(etag);
	/* UploadPartCopy's answer; radosgw sends the ETag bare */
	CHECK_INT(s3xml_parse_complete(part, strlen(part), &etag, NULL), 0);
	CHECK_STR(etag, "5f363e0e58a95f06cbe9bbc662c5dfb6");
	free(etag);
	etag = NULL;
	CHECK_INT(s3xml_parse_complete(err200, strlen(err200), &etag, &e),
		  -EIO);
	CHECK(etag == NULL);
	CHECK_STR(e.code, "InternalError");
	CHECK_STR(e.message,
		  "We encountered an internal error. Please try again.");
	CHECK_INT(s3xml_parse_complete(err200, strlen(err200), &etag, NULL),
		  -EIO);
	CHECK_INT(s3xml_parse_complete(ok, 60, &etag, &e), -EINVAL);
	CHECK_INT(s3xml_parse_complete("<ListBucketResult/>", 19, &etag, &e),
		  -EINVAL);
}

static void test_build(void)
{
	const char *const etags[] = { "\"a54357aff0632cce46d942af68356b38\"",
				      "\"0c78aef83f66abc1fa1e8477f296d394\"",
				      "x&y<z>'" };
	char *s;

	s = s3xml_build_complete(etags, 3);
	CHECK_STR(s, "<CompleteMultipartUpload>"
		     "<Part><PartNumber>1</PartNumber><ETag>&quot;a54357aff0632"
		     "cce46d942af68356b38&quot;</ETag></Part>"
		     "<Part><PartNumber>2</PartNumber><ETag>&quot;0c78aef83f66a"
		     "bc1fa1e8477f296d394&quot;</ETag></Part>"
		     "<Part><PartNumber>3</PartNumber><ETag>x&amp;y&lt;z&gt;"
		     "&apos;</ETag></Part></CompleteMultipartUpload>");
	free(s);
	errno = 0;
	CHECK(s3xml_build_complete(etags, 0) == NULL);
	CHECK_INT(errno, EINVAL);
}

static void test_iso8601(void)
{
	static const struct {
		const char *s;
		int r;
		int64_t t;
	} cases[] = {
		{ "2009-10-12T17:50:30.000Z", 0, 1255369830 },
		{ "2009-10-12T17:50:30Z", 0, 1255369830 },
		{ "1970-01-01T00:00:00Z", 0, 0 },
		{ "1969-12-31T23:59:59.999Z", 0, -1 },
		{ "2000-02-29T12:00:00.5Z", 0, 951825600 },
		{ "2009-10-12T19:50:30+02:00", 0, 1255369830 },
		{ "2009-10-12T16:20:30.123456789-01:30", 0, 1255369830 },
		{ "2038-01-19T03:14:08Z", 0, 2147483648LL },
		{ "2100-02-29T00:00:00Z", -EINVAL, 0 },
		{ "2009-13-12T17:50:30Z", -EINVAL, 0 },
		{ "2009-10-32T17:50:30Z", -EINVAL, 0 },
		{ "2009-10-12T24:00:00Z", -EINVAL, 0 },
		{ "2009-10-12 17:50:30Z", -EINVAL, 0 },
		{ "2009-10-12T17:50:30", -EINVAL, 0 },
		{ "2009-10-12T17:50:30.Z", -EINVAL, 0 },
		{ "2009-10-12T17:50:30.000Zjunk", -EINVAL, 0 },
		{ "Mon, 12 Oct 2009 17:50:30 GMT", -EINVAL, 0 },
		{ "", -EINVAL, 0 },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		int64_t t = 0;
		int r = s3xml_parse_iso8601(cases[i].s, &t);

		if (r != cases[i].r || (!r && t != cases[i].t))
			fprintf(stderr, "iso8601 \"%s\": %d %lld\n", cases[i].s,
				r, (long long)t);
		CHECK_INT(r, cases[i].r);
		if (!r)
			CHECK_INT(t, cases[i].t);
	}
}

int main(void)
{
	test_list_aws();
	test_list_rgw();
	test_list_url_encoded();
	test_list_bad();
	test_hostile();
	test_error();
	test_upload_id();
	test_mpu_list();
	test_complete();
	test_build();
	test_iso8601();
	return check_result();
}
